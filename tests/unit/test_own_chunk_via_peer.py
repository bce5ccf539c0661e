"""No-device tier: a push all-gather's own chunk read back from a peer (Options.own_chunk_via_peer)."""
from __future__ import annotations

import pytest

from conccl.collectives.all_gather import ALL_GATHER, own_chunk_via_peer, plan_all_gather
from conccl.collectives.all_reduce import ALL_REDUCE
from conccl.collectives.all_to_all import ALL_TO_ALL, equal_split_matrix, plan_all_to_all
from conccl.collectives.reduce_scatter import REDUCE_SCATTER
from conccl.executors.cuda.lowering import CopyBatch, CopyStep, SignalBatch, lower
from conccl.schedule.base import Algorithm, Buf, Copy, Phase, SetSignal, Signal, StreamMode

STRIDE = 1 << 40
BASE = {Buf.INPUT: 1 << 36, Buf.OUTPUT: 3 << 36, Buf.WORKSPACE: 5 << 36}


def _address(rank, buf):
    return BASE[buf] + rank * STRIDE


def _push(world, rank, nbytes=4096, mode=StreamMode.BATCH, in_place=False):
    return plan_all_gather(world, rank, nbytes, algorithm=Algorithm.PUSH, stream_mode=mode, output_symmetric=True,
                           in_place=in_place)


@pytest.mark.parametrize("mode", list(StreamMode))
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_every_copy_crosses_gpus_and_the_read_back_sits_between_the_push_and_the_done(world, mode):
    n = 1000
    for rank in range(world):
        plan = _push(world, rank, n, mode)
        via = own_chunk_via_peer(plan)
        copies = [op.transfer for ops in via.slots for op in ops if isinstance(op, Copy)]
        assert all(t.src_rank != t.dst_rank for t in copies)  # no same-GPU copy, so no SM kernel
        peer = (rank + 1) % world
        back = [t for t in copies if t.dst_rank == rank]
        assert back == [t for t in back if (t.src_rank, t.src, t.src_offset, t.dst, t.dst_offset, t.nbytes, t.phase)
                        == (peer, Buf.OUTPUT, rank * n, Buf.OUTPUT, rank * n, n, Phase.PEER)] and len(back) == 1
        (k,) = [k for k, ops in enumerate(via.slots) if any(isinstance(op, Copy) and op.transfer is back[0] for op in ops)]
        ops = list(via.slots[k])
        i = next(i for i, op in enumerate(ops) if isinstance(op, Copy) and op.transfer is back[0])
        push = next(j for j, op in enumerate(ops) if isinstance(op, Copy) and op.transfer.dst_rank == peer)
        done = next(j for j, op in enumerate(ops) if isinstance(op, SetSignal) and op.kind is Signal.DONE
                    and op.peer == peer)
        assert push < i < done
        assert back[0].slot == k and all(op.transfer.slot == j for j, s in enumerate(via.slots) for op in s
                                         if isinstance(op, Copy))
        # nothing else changed: slot by slot the same ops in the same order, less the own copy
        # (and the slot that held only it, a stream per peer's last)
        def key(op):
            return op.transfer.in_slot(0) if isinstance(op, Copy) else op

        own = [op for ops in plan.slots for op in ops if isinstance(op, Copy) and op.transfer.src_rank == rank
               and op.transfer.dst_rank == rank]
        own = [op for op in own if op.transfer.src is Buf.INPUT and op.transfer.dst is Buf.OUTPUT]
        before = [[key(op) for op in ops if op not in own] for ops in plan.slots]
        after = [[key(op) for op in ops if not (isinstance(op, Copy) and op.transfer is back[0])] for ops in via.slots]
        assert [s for s in before if s] == after


def test_what_has_no_own_chunk_copy_or_no_push_is_left_as_it_is():
    for plan in (plan_all_gather(2, 0, 4096),  # staged pull of plain tensors
                 plan_all_gather(2, 0, 4096, input_symmetric=True),
                 plan_all_gather(2, 0, 4096, algorithm=Algorithm.STAGED_PUSH),
                 _push(2, 0, in_place=True), _push(2, 0, nbytes=0), _push(1, 0)):
        assert own_chunk_via_peer(plan) is plan
    a2a = plan_all_to_all(2, 0, equal_split_matrix(2, 96), algorithm=Algorithm.PUSH, output_symmetric=True)
    for coll, plan in ((ALL_TO_ALL, a2a), (REDUCE_SCATTER, a2a), (ALL_REDUCE, a2a)):
        assert coll.own_chunk_via_peer(plan) is plan  # their own copies stay (documented)
    assert ALL_GATHER.own_chunk_via_peer(_push(2, 1)) == own_chunk_via_peer(_push(2, 1)) != _push(2, 1)


@pytest.mark.parametrize("world", [2, 4])
def test_a_batch_never_holds_a_copy_that_reads_what_another_of_it_writes(world):
    """cuMemcpyBatchAsync may run its copies in any order: the read-back starts a batch of its own."""
    pads = [(7 << 36) + r * STRIDE for r in range(world)]
    for rank in range(world):
        (steps,) = lower(own_chunk_via_peer(_push(world, rank)), _address, pads)
        assert [type(s) for s in steps] == [SignalBatch, CopyBatch, CopyBatch, SignalBatch]
        assert len(steps[1].copies) == world - 1 and len(steps[2].copies) == 1
        for step in steps:
            if isinstance(step, CopyBatch):
                for a in step.copies:
                    for b in step.copies:
                        assert not (a.src < b.dst + b.nbytes and b.dst < a.src + a.nbytes)
        # per stream and captured (no batches): plain copies, in the schedule's order
        for mode in (StreamMode.PER_PEER, StreamMode.SINGLE):
            lowered = lower(own_chunk_via_peer(_push(world, rank, mode=mode)), _address, pads, batch_copies=False)
            assert all(not isinstance(s, CopyBatch) for steps in lowered for s in steps)
            assert sum(isinstance(s, CopyStep) for steps in lowered for s in steps) == world


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("false", False), ("Off", False),
                                       ("no", False), ("1", True), ("yes", True), ("true", True)])
def test_the_environment_turns_it_on_for_new_groups_and_false_means_off(monkeypatch, value, on):
    from conccl.group.group import Options

    if value is None:
        monkeypatch.delenv("CONCCL_OWN_CHUNK_VIA_PEER", raising=False)
    else:
        monkeypatch.setenv("CONCCL_OWN_CHUNK_VIA_PEER", value)
    assert Options().own_chunk_via_peer is on
