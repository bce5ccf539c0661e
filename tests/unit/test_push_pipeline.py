"""The push all-gather+GEMM pipeline (``TPSchedule(push=True)``) as plain data: every peer's
shard pushed from its input into this rank's workspace, each GEMM step reading it there only
after the peer's DONE, nothing staged, and the workspace never freed while a step reads it."""
import dataclasses
from collections import Counter

import pytest

from conccl.collectives.all_gather import plan_all_gather
from conccl.collectives.direct import workspace_slot
from conccl.collectives.reduce_scatter import plan_reduce_scatter
from conccl.errors import InvalidArgument
from conccl.schedule.captured import graph_schedule
from conccl.schedule.pipeline import Order, TPSchedule, gather_then_gemm, gemm_steps, gemm_then_scatter
from conccl.planner import tp as tp_planner
from conccl.schedule.base import (DOUBLE_BUFFER_MAX_BYTES, Algorithm, AwaitMark, Buf, Compute, Copy, Mark, Phase, ResetMark,
                             ResetSignal, SetSignal, Signal, StreamMode, WaitSignal, max_slots)

PUSH = [TPSchedule(push=True), TPSchedule(push=True, gemm_streams=2)]
SMALL = (6, 16)  # rows, row bytes: a double-buffered call
WHOLE = (1 << 16, 1 << 10)  # 64 MiB a shard: the whole workspace at any world >= 2


def _flat(world, rank, rows, row_bytes):
    return plan_all_gather(world, rank, rows * row_bytes, algorithm=Algorithm.STAGED_PUSH,
                           stream_mode=StreamMode.PER_PEER)


def test_names_round_trip_and_push_takes_only_whole_shards_at_once():
    for tp in PUSH:
        assert TPSchedule.parse(tp.name) == tp
    assert [tp.name for tp in PUSH] == ["push", "push-s2"]
    for bad in ("push-p2", "push-g2", "push-s3"):
        with pytest.raises(InvalidArgument):
            TPSchedule.parse(bad)
    for kw in ({"serial": True}, {"order": Order.RING}, {"pieces": 2}):
        with pytest.raises(InvalidArgument):
            TPSchedule(push=True, **kw)
    assert TPSchedule(push=True).flat_algorithm() is Algorithm.STAGED_PUSH
    assert TPSchedule().flat_algorithm() is Algorithm.PULL


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("size", [SMALL, WHOLE], ids=["double", "whole"])
@pytest.mark.parametrize("tp", PUSH, ids=lambda t: t.name)
def test_each_step_reads_its_peers_slot_after_that_peers_done_and_nothing_is_staged(world, size, tp):
    rows, row_bytes = size
    chunk = rows * row_bytes
    slot = workspace_slot(chunk)
    plans = [gather_then_gemm(_flat(world, r, rows, row_bytes), tp, rows, row_bytes, keep_own=False)
             for r in range(world)]
    for rank, s in enumerate(plans):
        assert len(s.slots) <= max_slots(world)
        assert s.double_buffered == (world > 1 and world * slot <= DOUBLE_BUFFER_MAX_BYTES)
        # Only pushes: from this rank's input into slot `rank` of each peer's workspace, once.
        assert sorted(t.dst_rank for t in s.transfers) == [p for p in range(world) if p != rank]
        for t in s.transfers:
            assert (t.src_rank, t.src, t.src_offset, t.dst, t.dst_offset, t.nbytes, t.phase) == (
                rank, Buf.INPUT, 0, Buf.WORKSPACE, rank * slot, chunk, Phase.PEER)
        # Mark p is written on the control slot right after the wait for p's DONE of this call.
        marked_after_done = {}
        for prev, op in zip(s.slots[0], s.slots[0][1:]):
            if isinstance(op, Mark) and op.word < world:
                assert prev == WaitSignal(op.peer, Signal.DONE)
                marked_after_done[op.word] = op.peer
        assert marked_after_done == {p: p for p in range(world) if p != rank}
        computed = Counter()
        gemm = [ops for ops in s.slots if any(isinstance(op, Compute) for op in ops)]
        assert len(gemm) == min(tp.gemm_streams, len(gemm_steps(world, rank, tp, rows)))
        for ops in gemm:
            awaited = set()
            for op in ops:
                if isinstance(op, AwaitMark):
                    awaited.add(op.word)
                elif isinstance(op, Compute):
                    computed.update(range(op.row_start, op.row_end))
                    if op.own:
                        assert (op.row_start, op.row_end, op.ws_offset) == (rank * rows, (rank + 1) * rows, None)
                        assert ops.index(op) == 0  # nothing to wait for: the input is in place
                    else:
                        p = op.row_start // rows
                        assert (op.row_end - op.row_start, op.ws_offset) == (rows, p * slot)
                        assert p in awaited, "a step reads a peer's rows before its DONE"
                        # ... and the peer's push is what lands there
                        pushed = [t for t in plans[p].transfers if t.dst_rank == rank]
                        assert [(t.dst_offset, t.nbytes) for t in pushed] == [(op.ws_offset, chunk)]
        assert computed == Counter(range(world * rows))


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("tp", PUSH, ids=lambda t: t.name)
def test_a_whole_call_frees_its_workspace_only_after_every_gemm_step(world, tp):
    """Above 64 MiB the release (FREE) would let a double-buffered call after it push into
    either half while this call's GEMM steps still read the peers' slots: it waits for every
    GEMM slot's end mark. A double-buffered call frees the other half: no such wait."""
    for size in (WHOLE, SMALL):
        rows, row_bytes = size
        for rank in range(world):
            s = gather_then_gemm(_flat(world, rank, rows, row_bytes), tp, rows, row_bytes, keep_own=False)
            gemm = [ops for ops in s.slots if any(isinstance(op, Compute) for op in ops)]
            ends = [ops[-1] for ops in gemm]
            frees = [i for i, op in enumerate(s.slots[0]) if isinstance(op, SetSignal) and op.kind is Signal.FREE]
            assert frees
            if s.double_buffered:
                assert not any(isinstance(op, AwaitMark) for op in s.slots[0])
                assert not any(isinstance(e, Mark) for e in ends)
                continue
            assert all(isinstance(e, Mark) for e in ends) and len({e.word for e in ends}) == len(ends)
            waited = {op.word for op in s.slots[0][:frees[0]] if isinstance(op, AwaitMark)}
            assert waited == {e.word for e in ends}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("size", [SMALL, WHOLE], ids=["double", "whole"])
@pytest.mark.parametrize("tp", PUSH, ids=lambda t: t.name)
def test_every_mark_is_written_and_awaited_once_so_a_captured_call_resets_it(world, size, tp):
    rows, row_bytes = size
    for rank in range(world):
        s = gather_then_gemm(_flat(world, rank, rows, row_bytes), tp, rows, row_bytes, keep_own=False)
        written = Counter(op.word for ops in s.slots for op in ops if isinstance(op, Mark))
        awaited = Counter(op.word for ops in s.slots for op in ops if isinstance(op, AwaitMark))
        assert written == awaited and set(written.values()) <= {1}
        c = gather_then_gemm(_flat(world, rank, rows, row_bytes), tp, rows, row_bytes, keep_own=False, captured=True)
        written = Counter(op.word for ops in c.slots for op in ops if isinstance(op, Mark))
        awaited = Counter(op.word for ops in c.slots for op in ops if isinstance(op, AwaitMark))
        assert written == awaited and set(written.values()) <= {1}
        g = graph_schedule(c)
        for ops in g.slots:
            for i, op in enumerate(ops):
                if isinstance(op, AwaitMark):
                    assert ops[i + 1] == ResetMark(op.word, op.peer)
        # captured, each peer's DONE is awaited once (its reset after it): the mark follows it
        done_waits = Counter(op.peer for ops in g.slots for op in ops
                             if isinstance(op, WaitSignal) and op.kind is Signal.DONE)
        assert set(done_waits.values()) <= {1} and len(done_waits) == world - 1


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("tp", PUSH, ids=lambda t: t.name)
def test_keep_own_writes_every_chunk_once_behind_the_gemm_steps(world, tp):
    """The gathered rows' copies (same-GPU copies: SMs) run on the GEMM slots behind their steps,
    not beside them; each peer's copy-out behind the step that waited for that peer's rows."""
    rows, row_bytes = SMALL
    slot = workspace_slot(rows * row_bytes)
    for rank in range(world):
        s = gather_then_gemm(_flat(world, rank, rows, row_bytes), tp, rows, row_bytes, keep_own=True)
        covered = Counter()
        for t in s.transfers:
            if t.dst is Buf.OUTPUT and t.dst_rank == rank:
                covered.update(range(t.dst_offset, t.dst_offset + t.nbytes))
        assert covered == Counter(range(world * rows * row_bytes))
        for ops in s.slots:
            computes = [i for i, op in enumerate(ops) if isinstance(op, Compute)]
            for i, op in enumerate(ops):
                if not (isinstance(op, Copy) and op.transfer.dst is Buf.OUTPUT):
                    continue
                assert computes and i > computes[-1], "a copy into the output beside the GEMM steps"
                t = op.transfer
                if t.src is Buf.WORKSPACE:  # the slot waited for that peer's rows before
                    assert AwaitMark(t.src_offset // slot, t.src_offset // slot) in ops[:i]
        dropped = gather_then_gemm(_flat(world, rank, rows, row_bytes), PUSH[0], rows, row_bytes, keep_own=False)
        assert not any(t.dst is Buf.OUTPUT for t in dropped.transfers)
        assert not any(isinstance(op, Copy) and op.transfer.phase is Phase.STAGE for ops in s.slots for op in ops)


def test_a_pipeline_refuses_the_other_kind_of_flat_call_and_scatter_refuses_push():
    rows, row_bytes = SMALL
    with pytest.raises(InvalidArgument):
        gather_then_gemm(plan_all_gather(2, 0, rows * row_bytes), PUSH[0], rows, row_bytes)
    with pytest.raises(InvalidArgument):
        gather_then_gemm(_flat(2, 0, rows, row_bytes), TPSchedule(), rows, row_bytes)
    with pytest.raises(InvalidArgument):
        gemm_then_scatter(plan_reduce_scatter(2, 0, rows * row_bytes, "float32"), PUSH[0], rows, row_bytes)


def test_the_model_weighs_push_for_all_gather_only_and_saves_it_the_staging():
    m = tp_planner._default_model("NVIDIA H100 80GB HBM3", 2, None, None)
    m = dataclasses.replace(m, pipelines={})  # the model, not the shipped runs
    assert TPSchedule(push=True) in tp_planner.candidates(8192, 2)
    assert TPSchedule(push=True) not in tp_planner.candidates(8192, 2, scatter=True)
    args = (32768, 4096, 7168, 2)
    push = tp_planner.predict(m, "ag_gemm", TPSchedule(push=True), *args)
    direct = tp_planner.predict(m, "ag_gemm", TPSchedule(), *args)
    assert push < direct
    assert tp_planner.choose("gemm_rs", *args, model=m).schedule != TPSchedule(push=True)


def test_auto_weighs_push_only_at_a_world_size_whose_runs_timed_it():
    """Push takes world x the shard of workspace: a shape not timed gets it only where push
    was timed on as many GPUs (the shipped tables: world 2)."""
    shipped = tp_planner._default_model("NVIDIA H100 80GB HBM3", 2, None, None)
    assert tp_planner.push_measured(shipped, 2) and not tp_planner.push_measured(shipped, 4)
    untimed = (8192, 4096, 7168)  # the MLP block's column-parallel shape
    assert not shipped.pipelines["ag_gemm"].get("x".join(map(str, untimed)))
    assert tp_planner.choose("ag_gemm", *untimed, 2, model=shipped).schedule.push
    for world in (4, 8):
        for shape in (untimed, (32768, 8192, 14336)):
            assert not tp_planner.choose("ag_gemm", *shape, world, model=shipped).schedule.push
    bare = dataclasses.replace(shipped, pipelines={})
    assert not tp_planner.choose("ag_gemm", *untimed, 2, model=bare).schedule.push


def _signals(schedule):
    return Counter(op for ops in schedule.slots for op in ops if isinstance(op, (SetSignal, WaitSignal, ResetSignal)))


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("size", [SMALL, WHOLE], ids=["double", "whole"])
@pytest.mark.parametrize("tp", PUSH, ids=lambda t: t.name)
@pytest.mark.parametrize("keep_own", [False, True])
def test_captured_its_signals_are_the_flat_staged_push_alls_and_its_free_comes_after_every_step(world, size, tp,
                                                                                                  keep_own):
    """A peer may run the agreed flat call as a plain STAGED_PUSH all-gather: captured, both
    must make the same signals (free-gated up to 64 MiB). The FREE a captured call ends with
    lets the peers' next replay push into this rank's region: it comes last on the GEMM slot
    of the last step, behind every step and every copy out of the region (that slot waits
    for the other GEMM slot's end)."""
    rows, row_bytes = size
    for rank in range(world):
        flat = _flat(world, rank, rows, row_bytes)
        g = graph_schedule(gather_then_gemm(flat, tp, rows, row_bytes, keep_own=keep_own, captured=True))
        assert _signals(g) == _signals(graph_schedule(flat))
        if not flat.double_buffered:  # READY-gated: each replay's region is its own, no FREE
            assert not any(isinstance(op, SetSignal) and op.kind is Signal.FREE for ops in g.slots for op in ops)
            assert not any(isinstance(op, (Mark, AwaitMark)) and op.word >= 200 for ops in g.slots for op in ops)
            continue
        gemm = [k for k, ops in enumerate(g.slots) if any(isinstance(op, Compute) for op in ops)]
        last = max((op.index, k) for k in gemm for op in g.slots[k] if isinstance(op, Compute))[1]
        others = [k for k in gemm if k != last]
        assert all(isinstance(g.slots[k][-1], Mark) for k in others)  # each other GEMM slot ends with its mark
        tail = g.slots[last]
        frees = [i for i, op in enumerate(tail) if isinstance(op, SetSignal) and op.kind is Signal.FREE]
        assert len(frees) == world - 1 and frees == list(range(len(tail) - world + 1, len(tail)))  # last
        assert not any(isinstance(op, SetSignal) and op.kind is Signal.FREE
                       for k, ops in enumerate(g.slots) if k != last for op in ops)
        before = tail[:frees[0]]
        assert {op.word for op in before if isinstance(op, AwaitMark)} >= {g.slots[k][-1].word for k in others}
        reads = [i for i, op in enumerate(tail) if isinstance(op, Compute) or (
            isinstance(op, Copy) and op.transfer.src is Buf.WORKSPACE)]
        assert max(reads) < frees[0]
        for k in others:  # the other slot's reads of the region come before its end mark
            assert not any(isinstance(op, Copy) and op.transfer.src is Buf.WORKSPACE for op in g.slots[k][-1:])
        assert any(isinstance(op, WaitSignal) and op.kind is Signal.FREE for ops in g.slots for op in ops)


def test_graph_schedule_refuses_a_push_pipeline_not_built_for_capture():
    """Built eagerly (captured=False), push-s2's last GEMM slot does not wait for the other's
    end: a FREE placed behind it would free rows the other slot may still read."""
    rows, row_bytes = SMALL
    eager = gather_then_gemm(_flat(3, 0, rows, row_bytes), PUSH[1], rows, row_bytes, keep_own=False)
    with pytest.raises(ValueError):
        graph_schedule(eager)
