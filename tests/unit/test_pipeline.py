"""Tensor-parallel pipelines as plain data (conccl.schedule.pipeline) and the planner's model
(conccl.planner.tp): no device."""
from __future__ import annotations

import pytest

from conccl.collectives.all_gather import plan_all_gather
from conccl.collectives.reduce_scatter import plan_reduce_scatter
from conccl.errors import InvalidArgument
from conccl.schedule.pipeline import (SERIAL, Order, TPSchedule, gather_then_gemm, gemm_steps, gemm_then_scatter,
                             split_rows)
from conccl.planner import tp as tp_planner
from conccl.schedule.base import AwaitMark, Buf, Compute, Copy, Mark, Phase, Reduce, StreamMode, WaitSignal, max_slots

SCHEDULES = [SERIAL, TPSchedule(order=Order.RING), TPSchedule(), TPSchedule(pieces=4),
             TPSchedule(pieces=4, gemm_pieces=2), TPSchedule(order=Order.RING, pieces=3, gemm_pieces=3),
             TPSchedule(gemm_streams=2), TPSchedule(pieces=3, gemm_streams=2),
             TPSchedule(order=Order.RING, pieces=2, gemm_pieces=2, gemm_streams=2)]


def _gemm_slots(s):
    """The slots that run GEMM steps (one, or two with gemm_streams=2), and the others."""
    gemm = [ops for ops in s.slots if any(isinstance(op, Compute) for op in ops)]
    return gemm, [ops for ops in s.slots if not any(isinstance(op, Compute) for op in ops)]


def test_schedule_names_round_trip_and_bad_names_are_refused():
    for tp in SCHEDULES:
        assert TPSchedule.parse(tp.name) == tp
    assert TPSchedule.parse("direct-p2-s2") == TPSchedule(pieces=2, gemm_streams=2)
    for bad in ("fast", "direct-x2", "direct-p", "ring-p0", "serial-p2", "direct-s3", "direct-s0"):
        with pytest.raises(InvalidArgument):
            TPSchedule.parse(bad)
    with pytest.raises(InvalidArgument):
        TPSchedule(serial=True, pieces=2)


@pytest.mark.parametrize("rows,pieces", [(8, 4), (7, 3), (2, 5), (1, 1)])
def test_split_rows_covers_every_row_once(rows, pieces):
    cuts = split_rows(rows, pieces)
    assert cuts[0][0] == 0 and cuts[-1][1] == rows
    assert all(a < b for a, b in cuts) and all(cuts[i][1] == cuts[i + 1][0] for i in range(len(cuts) - 1))
    assert len(cuts) == min(rows, pieces)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("tp", SCHEDULES, ids=lambda t: t.name)
def test_gather_pipeline_moves_every_byte_once_and_computes_every_row_once(world, tp):
    rows, row_bytes = 6, 16
    for rank in range(world):
        flat = plan_all_gather(world, rank, rows * row_bytes, stream_mode=tp.stream_mode())
        s = gather_then_gemm(flat, tp, rows, row_bytes)
        assert len(s.slots) <= max_slots(world)  # the streams an executor has
        covered = bytearray(world * rows * row_bytes)
        for t in s.transfers:
            if t.dst is Buf.OUTPUT and t.dst_rank == rank:
                for b in range(t.dst_offset, t.dst_offset + t.nbytes):
                    covered[b] += 1
        assert all(c == 1 for c in covered)
        computed = [0] * (world * rows)
        marks = {op.word for ops in s.slots for op in ops if isinstance(op, Mark)}
        for ops in s.slots:
            for op in ops:
                if isinstance(op, Compute):
                    for r in range(op.row_start, op.row_end):
                        computed[r] += 1
                if isinstance(op, AwaitMark):
                    assert op.word in marks  # every wait has a writer
        assert computed == [1] * (world * rows)
        # Each GEMM slot waits, before each step, for the marks of every row that step reads:
        # a mark's rows are those of the copy into the output just before it.
        rows_of = {}
        for ops in s.slots:
            for prev, op in zip(ops, ops[1:]):
                if isinstance(op, Mark) and isinstance(prev, Copy) and prev.transfer.dst is Buf.OUTPUT:
                    t = prev.transfer
                    rows_of[op.word] = set(range(t.dst_offset // row_bytes, (t.dst_offset + t.nbytes) // row_bytes))
        gemm, _ = _gemm_slots(s)
        assert len(gemm) == (min(tp.gemm_streams, len(gemm_steps(world, rank, tp, rows))))
        for ops in gemm:
            landed = set()
            for op in ops:
                if isinstance(op, AwaitMark):
                    landed |= rows_of.get(op.word, set())
                elif isinstance(op, Compute) and not op.own:
                    assert set(range(op.row_start, op.row_end)) <= landed, "a step reads rows before they land"


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("tp", SCHEDULES, ids=lambda t: t.name)
def test_scatter_pipeline_sends_each_piece_after_its_rows_are_computed(world, tp):
    rows, row_bytes = 5, 8
    for rank in range(world):
        flat = plan_reduce_scatter(world, rank, rows * row_bytes, "float32", stream_mode=tp.stream_mode())
        s = gemm_then_scatter(flat, tp, rows, row_bytes)
        assert len(s.slots) <= max_slots(world)
        written = {}  # mark word -> rows computed before it on its slot
        every = set()
        gemm, copies = _gemm_slots(s)
        for ops in gemm:
            computed = set()
            for op in ops:
                if isinstance(op, Compute):
                    assert not computed & set(range(op.row_start, op.row_end))
                    computed |= set(range(op.row_start, op.row_end))
                elif isinstance(op, Mark):
                    written[op.word] = set(computed)
            every |= computed
        assert every == set(range(world * rows))
        for ops in copies:
            pending = None
            for op in ops:
                if isinstance(op, AwaitMark):
                    pending = op
                elif isinstance(op, Copy) and op.transfer.phase is Phase.PEER:
                    t = op.transfer
                    assert pending is not None, "a piece left before its mark"
                    need = set(range(t.src_offset // row_bytes, (t.src_offset + t.nbytes) // row_bytes))
                    assert need <= written[pending.word]
                    pending = None
        # The reduction: behind the last GEMM step on its stream, the peers' DONE waits right
        # before it; it reads the own rows, computed before it on its stream or marked elsewhere
        # and awaited; every mark has a waiter (a captured call's marks must be reset by one).
        (red_slot,) = [ops for ops in s.slots if any(isinstance(op, Reduce) for op in ops)]
        assert any(isinstance(op, Compute) for op in red_slot), "the reduction is not on a GEMM stream"
        at = next(i for i, op in enumerate(red_slot) if isinstance(op, Reduce))
        last = max(i for i, op in enumerate(red_slot) if isinstance(op, Compute))
        assert last < at and red_slot[last].index == len(gemm_steps(world, rank, tp, rows, scatter=True)) - 1
        between = red_slot[last + 1:at]
        assert all(isinstance(op, (Mark, AwaitMark, WaitSignal)) for op in between), between
        assert sorted(op.peer for op in between if isinstance(op, WaitSignal)) == [p for p in range(world) if p != rank]
        own = set(range(rank * rows, (rank + 1) * rows))
        before = set().union(*(set(range(op.row_start, op.row_end)) for op in red_slot[:at] if isinstance(op, Compute)))
        waited = {o.word for o in red_slot[:at] if isinstance(o, AwaitMark)}
        assert own <= before | set().union(*(written[w] for w in waited)), "the sum reads own rows not computed yet"
        awaited = {op.word for ops in s.slots for op in ops if isinstance(op, AwaitMark)}
        assert set(written) == awaited, "a mark nobody waits for (or a wait nobody marks)"
        sent = sum(t.nbytes for t in s.transfers if t.phase is Phase.PEER)
        assert sent == (world - 1) * rows * row_bytes


def test_gemm_steps_match_the_pipelines_compute_ops():
    for world in (2, 4):
        for tp in SCHEDULES:
            for scatter in (False, True):
                flat = (plan_reduce_scatter(world, 1, 48, "float32", stream_mode=tp.stream_mode()) if scatter
                        else plan_all_gather(world, 1, 48, stream_mode=tp.stream_mode()))
                s = (gemm_then_scatter if scatter else gather_then_gemm)(flat, tp, 6, 8)
                computes = sorted((op for ops in s.slots for op in ops if isinstance(op, Compute)),
                                  key=lambda op: op.index)
                assert [(op.row_start, op.row_end) for op in computes] == [(a, b) for a, b, _ in
                                                                           gemm_steps(world, 1, tp, 6, scatter)]


def test_too_many_pieces_for_the_marks_are_refused():
    flat = plan_all_gather(8, 0, 64 * 1000, stream_mode=StreamMode.PER_PEER)
    with pytest.raises(InvalidArgument, match="marks"):
        gather_then_gemm(flat, TPSchedule(pieces=64), 1000, 64)


def test_the_model_prefers_a_pipeline_where_the_transfer_is_long_and_pieces_are_free():
    # A weight whose GEMM time is exactly linear in rows (no decomposition loss) and a slow
    # link: a finer pipeline must win, and its predicted time must approach the GEMM alone.
    model = tp_planner.TPModel({"4096x1024x1024": {r: r * 1e-4 for r in (128, 256, 512, 1024, 2048, 4096)}},
                               flops=1e15, sm_count=132, nvlink_bytes_per_s=20e9, hbm_bytes_per_s=4e12,
                               contention=1.0)
    c = tp_planner.choose("ag_gemm", 4096, 1024, 1024, 2, model=model)
    serial = tp_planner.predict(model, "ag_gemm", SERIAL, 4096, 1024, 1024, 2)
    assert c.schedule.pieces > 1 and c.predicted_s < serial
    assert c.predicted_s < 1.2 * c.gemm_alone_s
    # The same with a GEMM that loses 50% per extra chunk: shard level (or serial) wins.
    lossy = tp_planner.TPModel({"4096x1024x1024": {r: 0.4096 * (1 + (4096 // r - 1) * 0.5) / (4096 // r)
                                                   for r in (128, 256, 512, 1024, 2048, 4096)}},
                               flops=1e15, sm_count=132, nvlink_bytes_per_s=400e9, hbm_bytes_per_s=4e12)
    assert tp_planner.choose("ag_gemm", 4096, 1024, 1024, 2, model=lossy).schedule.pieces == 1


def test_the_embedded_model_predicts_finite_positive_times_for_every_candidate():
    model = tp_planner.model_from()
    for op in tp_planner.OPS:
        for M, K, N in ((8192, 8192, 7168), (1000, 3000, 5000), (64, 64, 64)):
            for world in (1, 2, 4, 8):
                if M % world:
                    continue
                for tp in tp_planner.candidates(M, world):
                    t = tp_planner.predict(model, op, tp, M, K, N, world)
                    assert 0 < t < 1.0, (op, M, K, N, world, tp.name, t)
    with pytest.raises(InvalidArgument):
        tp_planner.choose("ag_gemm", 1001, 8, 8, 2)


def test_a_pipeline_lowers_its_marks_to_the_own_pads_mark_words_and_hands_back_its_gemm_steps():
    from conccl.executors.cuda.lowering import ComputeStep, SignalBatch, SignalStep, lower

    flat = plan_all_gather(2, 0, 4 * 16, stream_mode=StreamMode.PER_PEER)
    s = gather_then_gemm(flat, TPSchedule(pieces=2), 4, 16)
    address = lambda rank, buf: 1 << 20 * (1 + rank)  # noqa: E731
    lowered = lower(s, address, [0x1000, 0x2000], marks=0x9000)
    signals = [sig for steps in lowered for st in steps
               for sig in (st.signals if isinstance(st, SignalBatch) else (st,) if isinstance(st, SignalStep) else ())]
    mark_words = [(sig.is_wait, (sig.address - 0x9000) // 4) for sig in signals if sig.address >= 0x9000]
    written = sorted(w for wait, w in mark_words if not wait)
    awaited = sorted(w for wait, w in mark_words if wait)
    assert written == awaited == [2, 3]  # peer 1's two pieces: words 1 * 2 + j
    computes = [st.op for st in lowered[-1] if isinstance(st, ComputeStep)]
    assert [(c.row_start, c.row_end, c.own) for c in computes] == [(0, 4, True), (4, 6, False), (6, 8, False)]
    with pytest.raises(TypeError, match="mark"):
        lower(s, address, [0x1000, 0x2000])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("tp", [t for t in SCHEDULES if not t.serial], ids=lambda t: t.name)
def test_the_own_chunk_is_copied_after_the_last_gemm_step_or_not_at_all(world, tp):
    rows, row_bytes, rank = 6, 16, 1
    flat = plan_all_gather(world, rank, rows * row_bytes, stream_mode=tp.stream_mode())
    assert any(t.phase is Phase.LOCAL for t in flat.transfers)  # the flat all-gather copies it
    own = range(rank * rows * row_bytes, (rank + 1) * rows * row_bytes)
    dropped = gather_then_gemm(flat, tp, rows, row_bytes, keep_own=False)
    assert not any(t.phase is Phase.LOCAL for t in dropped.transfers)
    assert {t.dst_offset // (rows * row_bytes) for t in dropped.transfers if t.dst is Buf.OUTPUT} == \
        set(range(world)) - {rank}
    kept = gather_then_gemm(flat, tp, rows, row_bytes)
    local = [(k, i) for k, ops in enumerate(kept.slots) for i, op in enumerate(ops)
             if isinstance(op, Copy) and op.transfer.phase is Phase.LOCAL]
    assert len(local) == 1
    k, i = local[0]
    t = kept.slots[k][i].transfer
    assert t.dst_offset == own.start and t.nbytes == len(own) and t.slot == k
    last = max((op for ops in kept.slots for op in ops if isinstance(op, Compute)), key=lambda op: op.index)
    assert last in kept.slots[k][:i]  # behind the last GEMM step, on its stream
    for n, ops in enumerate(kept.slots):  # every transfer numbered with the slot it sits in
        assert all(op.transfer.slot == n for op in ops if isinstance(op, Copy))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("tp", [t for t in SCHEDULES if not t.serial], ids=lambda t: t.name)
def test_the_own_gemm_step_waits_for_a_staging_copy_that_waits_first(world, tp):
    """Above DOUBLE_BUFFER_MAX_BYTES the staging waits for the peers' DONE first, and the own
    GEMM step waits for the staging; below, the staging is queued first with no wait and the
    GEMM does not wait for it; a symmetric input is not staged."""
    from conccl.schedule.base import DOUBLE_BUFFER_MAX_BYTES

    rank = 0
    for rows, row_bytes, symmetric, waits_for_stage in ((6, 16, False, False), (6, 16, True, False),
                                                        (4, DOUBLE_BUFFER_MAX_BYTES // 2, False, True)):
        flat = plan_all_gather(world, rank, rows * row_bytes, stream_mode=tp.stream_mode(), input_symmetric=symmetric)
        s = gather_then_gemm(flat, tp, rows, row_bytes)
        stage = [(ops, i) for ops in s.slots for i, op in enumerate(ops)
                 if isinstance(op, Copy) and op.transfer.phase is Phase.STAGE]
        own = [(ops, i) for ops in s.slots for i, op in enumerate(ops) if isinstance(op, Compute) and op.own]
        assert len(own) == 1 and len(stage) == (0 if symmetric else 1)
        ops, i = own[0]
        waits = [op for op in ops[:i] if isinstance(op, AwaitMark)]
        if not waits_for_stage:
            assert not waits
            continue
        sops, j = stage[0]
        assert isinstance(sops[j + 1], Mark) and waits == [AwaitMark(sops[j + 1].word, sops[j + 1].peer)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("tp", SCHEDULES, ids=lambda t: t.name)
def test_every_mark_is_written_once_and_awaited_once_and_captured_waits_reset(world, tp):
    """What a captured pipeline's marks rely on (conccl.schedule.captured): each awaited once per call, so
    the reset after that one wait leaves every word 0 for the next replay."""
    from collections import Counter

    from conccl.schedule.captured import graph_schedule
    from conccl.schedule.base import ResetMark

    rows, row_bytes = 6, 16
    for rank in range(world):
        for symmetric in (False, True):
            for s in (gather_then_gemm(plan_all_gather(world, rank, rows * row_bytes, stream_mode=tp.stream_mode(),
                                                       input_symmetric=symmetric), tp, rows, row_bytes),
                      gemm_then_scatter(plan_reduce_scatter(world, rank, rows * row_bytes, "float32",
                                                            stream_mode=tp.stream_mode()), tp, rows, row_bytes)):
                written = Counter(op.word for ops in s.slots for op in ops if isinstance(op, Mark))
                awaited = Counter(op.word for ops in s.slots for op in ops if isinstance(op, AwaitMark))
                assert written == awaited and set(written.values()) <= {1}
                g = graph_schedule(s)
                for ops in g.slots:
                    for i, op in enumerate(ops):
                        if isinstance(op, AwaitMark):
                            assert ops[i + 1] == ResetMark(op.word, op.peer)
                assert sum(isinstance(op, ResetMark) for ops in g.slots for op in ops) == sum(awaited.values())


def test_a_whole_workspace_scatter_pipeline_keeps_its_release_behind_the_sum():
    # Above the double-buffer bound the flat reduce-scatter releases its workspace (FREE) after
    # its reduction: moved with it behind the last GEMM step, still after the sum.
    rows, row_bytes = 2048, 32768  # 64 MiB per rank: one workspace, no halves
    flat = plan_reduce_scatter(2, 0, rows * row_bytes, "bfloat16", stream_mode=StreamMode.PER_PEER)
    assert not flat.double_buffered
    s = gemm_then_scatter(flat, TPSchedule(), rows, row_bytes)
    (red_slot,) = [ops for ops in s.slots if any(isinstance(op, Reduce) for op in ops)]
    at = next(i for i, op in enumerate(red_slot) if isinstance(op, Reduce))
    flat_ops = next(ops for ops in flat.slots if any(isinstance(op, Reduce) for op in ops))
    after = flat_ops[next(i for i, op in enumerate(flat_ops) if isinstance(op, Reduce)) + 1:]
    assert after and tuple(red_slot[at + 1:]) == tuple(after)  # the release, in order, behind the sum


def test_a_scatter_pipeline_refuses_what_it_cannot_move():
    import dataclasses

    flat = plan_reduce_scatter(2, 0, 64, "float32", stream_mode=StreamMode.PER_PEER)
    red = next(op for ops in flat.slots for op in ops if isinstance(op, Reduce))
    twice = dataclasses.replace(flat, slots=(flat.slots[0] + (red,),) + flat.slots[1:])
    with pytest.raises(InvalidArgument, match="one reduction"):
        gemm_then_scatter(twice, TPSchedule(), 4, 16)
    copy = next(op for ops in flat.slots for op in ops if isinstance(op, Copy))
    behind = dataclasses.replace(flat, slots=(flat.slots[0] + (copy,),) + flat.slots[1:])
    with pytest.raises(InvalidArgument, match="only signals"):
        gemm_then_scatter(behind, TPSchedule(), 4, 16)
