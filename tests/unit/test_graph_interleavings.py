"""Captured calls under every kind of timing: each rank replays its graph (a run of captured
calls, as :func:`conccl.schedule.captured.graph_schedule` makes them) several times, one op at a time in
random orders, as GPUs could run them (the eager model's way, test_protocol_interleavings.py).

A captured call has its own signal words, marks and workspace region (:mod:`conccl.schedule.captured`):
signals write 1, a wait waits for 1 and resets the word, each graph slot's FREE words start
primed. Checked: every read of a workspace byte, by a copy or by a push pipeline's GEMM step
(``Compute.ws_offset``), sees the bytes this replay wrote there, never the previous or the
next replay's; every run finishes. Ranks may run a push all-gather+GEMM pipeline (push,
push-s2, keeping the gathered rows or not) or the plain flat ``STAGED_PUSH`` all-gather on
the same agreed call. The counter-test moves a push pipeline's FREE before its last GEMM step.
"""
from __future__ import annotations

import dataclasses
import random

import pytest

from conccl.collectives.all_gather import plan_all_gather
from conccl.collectives.reduce_scatter import plan_reduce_scatter
from conccl.schedule.captured import graph_schedule
from conccl.schedule.pipeline import TPSchedule, gather_then_gemm
from conccl.schedule.base import (MARK_WORDS, Algorithm, AwaitMark, Buf, Compute, Copy, Mark, Reduce, ResetMark,
                             ResetSignal, SetSignal, Signal, StreamMode, WaitSignal, signal_pad_words, signal_word)
from test_protocol_interleavings import op_bytes  # the eager model's: what a copy or a sum reads and writes

ROW_BYTES = 16


@pytest.fixture(autouse=True)
def small_double_buffer(monkeypatch):
    """Calls over 1 KiB of workspace take it whole (the ``_big`` kinds): both forms checked."""
    import conccl.schedule.base as schedule

    for plan in (plan_all_gather, plan_reduce_scatter):
        plan.cache_clear()
    monkeypatch.setattr(schedule, "DOUBLE_BUFFER_MAX_BYTES", 1024)
    yield
    for plan in (plan_all_gather, plan_reduce_scatter):
        plan.cache_clear()


def _plan(world, rank, kind, mode):
    """This rank's captured schedule of ``kind`` ("a|b": rank 0 runs a, the others b)."""
    if "|" in kind:
        first, rest = kind.split("|")
        kind = first if rank == 0 else rest
    rows = 32 if kind.endswith("_big") else 2
    kind = kind.removesuffix("_big")
    if kind in ("push", "push_s2"):
        flat = plan_all_gather(world, rank, rows * ROW_BYTES, algorithm=Algorithm.STAGED_PUSH,
                               stream_mode=StreamMode.PER_PEER)
        tp = TPSchedule(push=True, gemm_streams=2 if kind == "push_s2" else 1)
        return graph_schedule(gather_then_gemm(flat, tp, rows, ROW_BYTES, keep_own=rank % 2 == 0, captured=True))
    if kind == "flat":
        return graph_schedule(plan_all_gather(world, rank, rows * ROW_BYTES, algorithm=Algorithm.STAGED_PUSH,
                                              stream_mode=mode))
    if kind == "rs":
        return graph_schedule(plan_reduce_scatter(world, rank, rows * ROW_BYTES, "float32", stream_mode=mode))
    return graph_schedule(plan_all_gather(world, rank, rows * ROW_BYTES, stream_mode=mode))  # "ag": staged pull


def _run(world, calls, mode, seed, replays=4, plans=None):
    """Replay every rank's graph of ``calls`` ``replays`` times in a random interleaving; the
    first stale or early workspace read, as a string, or None."""
    rng = random.Random(seed)
    slow = rng.randrange(world) if seed % 2 else None
    plans = plans or [[_plan(world, r, kind, mode) for kind in calls] for r in range(world)]
    words = signal_pad_words(world)
    pads = [[[0] * words for _ in calls] for _ in range(world)]  # per rank, per graph slot
    for r in range(world):
        for c in range(len(calls)):
            for src in range(world):
                pads[r][c][signal_word(Signal.FREE, src, world)] = 1  # primed (graphs.primed_free_words)
    marks = [[[0] * MARK_WORDS for _ in calls] for _ in range(world)]
    tags: dict = {}  # (call, rank, workspace byte) -> the replay that wrote it
    at = [(0, 0)] * world  # each rank's (replay, call)
    pcs = [None] * world

    def reads_stale(who, off, n, c, replay):
        for i in range(off, off + n, 8):
            if tags.get((c, who, i)) != replay:
                return f"byte {i} of rank {who}'s region holding replay {tags.get((c, who, i))}'s"
        return None

    def step(r, k):
        replay, c = at[r]
        schedule = plans[r][c]
        op = schedule.slots[k][pcs[r][k]]
        pad = pads[r][c]
        where = f"rank {r} replay {replay} call {c} ({calls[c]})"
        if isinstance(op, WaitSignal):
            if pad[signal_word(op.kind, op.peer, world)] < 1:
                return "blocked"
        elif isinstance(op, SetSignal):
            pads[op.peer][c][signal_word(op.kind, r, world)] = 1
        elif isinstance(op, ResetSignal):
            pad[signal_word(op.kind, op.peer, world)] = 0
        elif isinstance(op, AwaitMark):
            if marks[r][c][op.word] < 1:
                return "blocked"
        elif isinstance(op, Mark):
            marks[r][c][op.word] = 1
        elif isinstance(op, ResetMark):
            marks[r][c][op.word] = 0
        elif isinstance(op, Compute) and op.ws_offset is not None:
            stale = reads_stale(r, op.ws_offset, (op.row_end - op.row_start) * ROW_BYTES, c, replay)
            if stale:
                return f"{where}: a GEMM step read {stale}"
        elif isinstance(op, (Copy, Reduce)):
            reads, writes = op_bytes(op, r)
            for who, buf, off, n in reads:
                stale = buf is Buf.WORKSPACE and reads_stale(who, off, n, c, replay)
                if stale:
                    return f"{where}: a copy read {stale}"
            for who, buf, off, n in writes:
                if buf is Buf.WORKSPACE:
                    for i in range(off, off + n, 8):
                        tags[(c, who, i)] = replay
        pcs[r][k] += 1
        return None

    def words_left():
        """After every replay: marks 0, every signal word 0 but the FREE words, primed again (1)."""
        for r in range(world):
            for c in range(len(calls)):
                if any(marks[r][c]):
                    return f"rank {r} call {c} ({calls[c]}): marks left set {[w for w, v in enumerate(marks[r][c]) if v]}"
                for src in range(world):
                    for kind in Signal:
                        want = 1 if kind is Signal.FREE else 0
                        if src != r and pads[r][c][signal_word(kind, src, world)] != want:
                            return f"rank {r} call {c} ({calls[c]}): {kind.name} word of {src} left at " \
                                   f"{pads[r][c][signal_word(kind, src, world)]}"
        return None

    for _ in range(400_000):
        runnable = []
        for r in range(world):
            replay, c = at[r]
            if replay == replays:
                continue
            if pcs[r] is None or all(pc == len(ops) for pc, ops in zip(pcs[r], plans[r][c].slots)):
                if pcs[r] is not None:  # the call ended on every stream: the graph's next node
                    c += 1
                    replay, c = (replay + 1, 0) if c == len(calls) else (replay, c)
                    at[r] = (replay, c)
                    if replay == replays:
                        continue
                pcs[r] = [0] * plans[r][c].num_slots
            runnable += [(r, k) for k, ops in enumerate(plans[r][c].slots) if pcs[r][k] < len(ops)]
        if not runnable:
            return words_left()
        rng.shuffle(runnable)
        if slow is not None and rng.random() < 0.9:
            runnable.sort(key=lambda rk: rk[0] == slow)
        for r, k in runnable:
            result = step(r, k)
            if result != "blocked":
                if result is not None:
                    return result
                break
        else:
            return f"deadlock: ranks at (replay, call) {at}"
    return "did not finish"


KINDS = ("push", "push_s2", "push|flat", "flat|push", "push|push_s2", "push_big", "push_big|flat_big",
         "flat_big|push_s2_big", "rs", "ag", "rs_big")


@pytest.mark.parametrize("mode", list(StreamMode))
@pytest.mark.parametrize("world", [2, 3, 4])
def test_replays_read_only_their_own_bytes_and_finish(world, mode):
    """Graphs of one to four calls: with one or two, a call's next replay runs beside a slow
    peer's previous one (more calls in between wait for that peer's DONE first)."""
    for seed in range(30):
        rng = random.Random(seed)
        calls = [rng.choice(KINDS) for _ in range(rng.choice((1, 1, 2, 4)))]
        assert _run(world, calls, mode, seed) is None, (world, mode, seed, calls)


def _free_before_last_step(schedule):
    """A captured push pipeline with its FREE moved in front of its last GEMM step."""
    slots = [list(ops) for ops in schedule.slots]
    for ops in slots:
        frees = [op for op in ops if isinstance(op, SetSignal) and op.kind is Signal.FREE]
        computes = [i for i, op in enumerate(ops) if isinstance(op, Compute)]
        if frees and computes:
            rest = [op for op in ops if op not in frees]
            at = max(i for i, op in enumerate(rest) if isinstance(op, Compute))
            slots[slots.index(ops)] = rest[:at] + frees + rest[at:]
    return dataclasses.replace(schedule, slots=tuple(tuple(ops) for ops in slots))


@pytest.mark.parametrize("world", [2, 3])
def test_the_model_sees_a_free_sent_before_the_last_gemm_step(world):
    """The counter-test: with the FREE before the last step, a peer's next replay pushes into
    the region while that step still reads it; as built, no run does."""
    for kind in ("push", "push_s2", "push|flat", "flat|push_s2"):
        plans = [[_free_before_last_step(_plan(world, r, kind, StreamMode.PER_PEER))] for r in range(world)]
        found = [_run(world, [kind], StreamMode.PER_PEER, seed, replays=6, plans=plans) for seed in range(40)]
        assert any(f and "GEMM step read" in f for f in found), kind
    for kind in ("push", "push_s2", "push|flat", "flat|push_s2", "push_big", "push_big|flat_big"):
        assert all(_run(world, [kind], StreamMode.PER_PEER, seed, replays=6) is None for seed in range(40)), kind


def _captured_pipelines(world, rank):
    """Every kind of captured pipeline a rank may run (graph_schedule of conccl.schedule.pipeline's)."""
    from conccl.schedule.pipeline import Order, gemm_then_scatter

    rows, row_bytes = 6, 16
    out = []
    for tp in (TPSchedule(), TPSchedule(pieces=3), TPSchedule(pieces=2, gemm_pieces=2, gemm_streams=2),
               TPSchedule(order=Order.RING, pieces=2), TPSchedule(serial=True), TPSchedule(gemm_streams=2)):
        flat = plan_all_gather(world, rank, rows * row_bytes, stream_mode=tp.stream_mode())
        out.append(graph_schedule(gather_then_gemm(flat, tp, rows, row_bytes, captured=True)))
        rs = plan_reduce_scatter(world, rank, rows * row_bytes, "float32", stream_mode=tp.stream_mode())
        out.append(graph_schedule(gemm_then_scatter(rs, tp, rows, row_bytes)))
    for s2 in (1, 2):
        flat = plan_all_gather(world, rank, rows * row_bytes, stream_mode=StreamMode.PER_PEER,
                               algorithm=Algorithm.STAGED_PUSH)
        out.append(graph_schedule(gather_then_gemm(flat, TPSchedule(push=True, gemm_streams=s2), rows, row_bytes,
                                                   keep_own=False, captured=True)))
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_marks_as_graph_edges_keep_every_op_and_record_before_wait(world):
    from conccl.schedule.captured import mark_edges

    for rank in range(world):
        for s in _captured_pipelines(world, rank):
            segments = mark_edges(s)
            written = [op.word for ops in s.slots for op in ops if isinstance(op, Mark)]
            edges = {op.word for ops in s.slots for op in ops if isinstance(op, AwaitMark)}
            assert edges and edges <= set(written)  # a pipeline's every wait has its writer in the call
            for k, ops in enumerate(s.slots):
                # the slot rebuilt from its segments (waits, ops, records, in order) is the slot
                # but for the edges' resets: each event recorded right where its mark was written
                # (after the ops before it, before those after it), each waited on where it was
                rebuilt = tuple(x for seg in segments if seg.slot == k
                                for x in ([AwaitMark(w, s.rank) for w in seg.waits] + list(seg.ops)
                                          + [Mark(w, s.rank) for w in seg.records]))
                want = tuple(op for op in ops if not (isinstance(op, ResetMark) and op.word in edges))
                strip = lambda xs: tuple((type(x), x.word) if isinstance(x, (Mark, AwaitMark)) else x  # noqa: E731
                                         for x in xs)  # a mark's peer field is not kept
                assert strip(rebuilt) == strip(want)
            recorded: set = set()
            for seg in segments:  # the host's queueing order: a wait after its record
                assert set(seg.waits) <= recorded, (seg, recorded)
                recorded.update(seg.records)
            assert recorded == edges
            # the waits before a step are the ones the schedule had there: a step's own position
            for k, ops in enumerate(s.slots):
                want = []  # (edge words awaited since the last non-mark op, that op)
                pending = []
                for op in ops:
                    if isinstance(op, AwaitMark) and op.word in edges:
                        pending.append(op.word)
                    elif not isinstance(op, (Mark, ResetMark)) or op.word not in edges:
                        if pending:
                            want.append((tuple(pending), op))
                            pending = []
                got = [(seg.waits, seg.ops[0]) for seg in segments if seg.slot == k and seg.waits and seg.ops]
                assert got == want


def test_a_cycle_of_marks_is_refused():
    from conccl.schedule.captured import mark_edges
    from conccl.schedule.base import Schedule

    s = Schedule(collective="all_gather", world=2, rank=0, algorithm=Algorithm.PULL, stream_mode=StreamMode.PER_PEER,
                 staged=False, slots=((AwaitMark(1, 0), Mark(2, 0)), (AwaitMark(2, 0), Mark(1, 0))))
    with pytest.raises(ValueError, match="cycle"):
        mark_edges(s)
