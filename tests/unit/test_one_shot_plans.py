"""One-shot schedules (conccl.collectives.one_shot) as plain data, and their lowering to one
kernel launch with every address resolved (no GPU: the step is a named tuple)."""
from __future__ import annotations

import pytest

from conccl.collectives.all_gather import plan_one_shot_all_gather
from conccl.collectives.all_reduce import plan_one_shot_all_reduce
from conccl.collectives.all_to_all import equal_split_matrix, plan_one_shot_all_to_all
from conccl.collectives.reduce_scatter import plan_one_shot_reduce_scatter
from conccl.executors.cuda.lowering import OneShotStep, lower, lower_slot
from conccl.schedule.captured import graph_schedule
from conccl.schedule.base import Buf, Copy, Phase, Reduce, ResetSignal, SetSignal, Signal, WaitSignal, signal_word


def _address(rank, buf):
    return {Buf.INPUT: 0x1000, Buf.OUTPUT: 0x2000, Buf.WORKSPACE: 0x100000 * (rank + 1)}[buf] + rank * 0x10000000


PADS = [0xA0000000 + 0x1000000 * r for r in range(4)]


def test_a_one_shot_all_gather_stages_signals_once_and_reads_every_peer():
    s = plan_one_shot_all_gather(4, 1, 256, False)
    assert s.one_shot and s.double_buffered and s.workspace_bytes == 256 and s.num_slots == 1
    ops = s.slots[0]
    copies = [op.transfer for op in ops if isinstance(op, Copy)]
    assert [(t.phase, t.src_rank, t.src, t.dst_offset) for t in copies] == [
        (Phase.STAGE, 1, Buf.INPUT, 0), (Phase.LOCAL, 1, Buf.INPUT, 256),
        (Phase.PEER, 2, Buf.WORKSPACE, 512), (Phase.PEER, 3, Buf.WORKSPACE, 768), (Phase.PEER, 0, Buf.WORKSPACE, 0)]
    # one signal on the critical path: READY; DONE after the reads; the release
    waits = [(op.kind, op.seq_delta) for op in ops if isinstance(op, WaitSignal)]
    assert waits == [(Signal.READY, 0)] * 3 + [(Signal.DONE, -1)] * 3
    assert [op.kind for op in ops if isinstance(op, SetSignal)] == [Signal.READY] * 3 + [Signal.DONE] * 3 + [Signal.FREE] * 3
    assert not any(isinstance(op, Copy) and op.transfer.phase is Phase.LOCAL
                   for op in plan_one_shot_all_gather(4, 1, 256, True).slots[0])  # in place: no own piece


def test_one_shot_reductions_read_every_ranks_piece_in_rank_order():
    rs = plan_one_shot_reduce_scatter(3, 2, 64, "bfloat16", 0.5)
    (red,) = [op for op in rs.slots[0] if isinstance(op, Reduce)]
    assert red.src_ranks == (0, 1, 2) and red.srcs == ((Buf.WORKSPACE, 128), (Buf.WORKSPACE, 128), (Buf.INPUT, 128))
    assert (red.dst, red.nbytes, red.dtype, red.scale) == ((Buf.OUTPUT, 0), 64, "bfloat16", 0.5)
    assert rs.workspace_bytes == 192  # the whole input is staged: every peer reads its chunk of it
    ar = plan_one_shot_all_reduce(2, 0, 4096, "float32", 1.0)
    (red,) = [op for op in ar.slots[0] if isinstance(op, Reduce)]
    assert red.srcs == ((Buf.INPUT, 0), (Buf.WORKSPACE, 0)) and red.nbytes == 4096


def test_a_one_shot_all_to_all_reads_its_chunk_of_every_peer():
    m = ((8, 16, 24), (4, 4, 4), (0, 32, 8))
    s = plan_one_shot_all_to_all(3, 1, m)
    pieces = {op.transfer.src_rank: (op.transfer.src_offset, op.transfer.dst_offset, op.transfer.nbytes)
              for op in s.slots[0] if isinstance(op, Copy) and op.transfer.phase is not Phase.STAGE}
    assert pieces == {0: (8, 0, 16), 1: (4, 16, 4), 2: (0, 20, 32)}
    assert s.workspace_bytes == 48  # the largest input: alike on every rank
    assert plan_one_shot_all_to_all(2, 0, equal_split_matrix(2, 8)).workspace_bytes == 16


def test_each_collective_plans_its_one_shot_call_from_its_own_validated_call():
    """Collective.plan_one_shot, as the group asks it: from the call's typed extra and the
    peers' rows; None where the kernel serves no such world, and for a widening reduce-scatter."""
    import torch

    from conccl.collectives import REGISTRY
    from conccl.collectives.base import PeerCalls

    world, rank, f32 = 4, 1, torch.float32
    m = equal_split_matrix(world, 64)
    peers = PeerCalls(send=m, recv=m, input_bytes=(256,) * world, output_bytes=(256,) * world)
    calls = {"all_gather": ((torch.empty(world * 64, dtype=f32), torch.empty(64, dtype=f32), ()),
                            plan_one_shot_all_gather(world, rank, 256, False)),
             "all_to_all": ((torch.empty(64, dtype=f32), torch.empty(64, dtype=f32), (None, None)),
                            plan_one_shot_all_to_all(world, rank, m)),
             "reduce_scatter": ((torch.empty(64, dtype=f32), torch.empty(world * 64, dtype=f32), (None,)),
                                plan_one_shot_reduce_scatter(world, rank, 256, "float32", 1.0)),
             "all_reduce": ((torch.empty(100, dtype=f32), torch.empty(100, dtype=f32), (None,)),
                            plan_one_shot_all_reduce(world, rank, 400, "float32", 1.0))}
    assert set(calls) == set(REGISTRY)
    for name, ((output, input, args), expected) in calls.items():
        coll = REGISTRY[name]
        call = coll.local(output, input, args, world, rank, "cpu")
        assert coll.plan_one_shot(world, rank, call, peers) is expected, name
        assert coll.plan_one_shot(1, 0, call, peers) is None and coll.plan_one_shot(9, rank, call, peers) is None
    rs = REGISTRY["reduce_scatter"]
    widening = rs.local_parts(torch.empty(64, dtype=f32), [torch.empty(world * 64, dtype=torch.bfloat16)], [64],
                              (None,), world, rank, "cpu")
    assert widening.extra.out_dtype == "float32" and rs.plan_one_shot(world, rank, widening, peers) is None


def test_lowered_one_shot_is_one_launch_with_the_protocol_words():
    s = plan_one_shot_all_gather(4, 1, 256, False)
    ((step,),) = lower(s, _address, PADS, spin_words=0xBEEF0)
    assert isinstance(step, OneShotStep) and not step.graph and step.kind == "gather"
    assert step.staged == tuple(_address(q, Buf.WORKSPACE) for q in range(4))
    assert step.signal_to[2] == PADS[2] + 4 * signal_word(Signal.READY, 1, 4) and step.signal_to[1] == 0
    assert step.done_to[0] == PADS[0] + 4 * signal_word(Signal.DONE, 1, 4)
    assert step.wait_signal[3] == PADS[1] + 4 * signal_word(Signal.READY, 3, 4)
    assert step.nbytes == (256, 256, 256, 256) and step.dst_off == (0, 256, 512, 768) and step.stage_bytes == 256
    assert (step.abort_word, step.timed_out_word) == (0xBEEF0, 0xBEEF4)
    # captured: the graph form (FREE of the previous replay first, resets), DONE written as FREE
    g = graph_schedule(s)
    assert g.one_shot and any(isinstance(op, ResetSignal) for op in g.slots[0])
    ((gstep,),) = lower(g, _address, PADS, spin_words=0xBEEF0)
    assert gstep.graph and gstep.done_to[0] == PADS[0] + 4 * signal_word(Signal.FREE, 1, 4)
    with pytest.raises(TypeError, match="spin words"):
        lower(s, _address, PADS)
    with pytest.raises(TypeError, match="one-shot"):  # peers' operands never reach the copy-engine lowering
        lower_slot(plan_one_shot_all_reduce(2, 0, 64, "float32", 1.0).slots[0], _address, PADS, 0, 2, False)


def test_the_one_shot_limit_comes_from_the_environment(monkeypatch):
    from conccl.errors import InvalidArgument
    from conccl.group.options import Options

    for raw, limit in (("", 0), ("0", 0), ("256K", 256 << 10), ("1M", 1 << 20)):
        monkeypatch.setenv("CONCCL_ONE_SHOT_BELOW", raw)
        assert Options().one_shot_below == limit
    monkeypatch.setenv("CONCCL_ONE_SHOT_BELOW", "lots")
    with pytest.raises(InvalidArgument, match="CONCCL_ONE_SHOT_BELOW"):
        Options()
