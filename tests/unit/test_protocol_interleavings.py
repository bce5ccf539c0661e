"""The signal protocol under every kind of timing: the ranks' schedules for a run of mixed
calls executed in one process, one op at a time, in random orders, as GPUs could run them.

What a GPU allows and the CPU reference executor (whose ranks agree on every call on the
host board, and so never run more than a call apart) cannot show: a rank whose host queued
every call long ago runs on into the next calls while a peer is still in this one, limited
only by the signals. The model: each rank's calls run in order; a call's slots run as
concurrent streams that start when the rank's previous call has ended; a wait blocks its
slot until the own pad's word is >= the awaited value; any runnable op of any rank may go
next (random, seeded; one rank is made slow in half the runs).

Checked, for the group workspace (what double buffering guards, :mod:`conccl.schedule.base`):
every read of a workspace byte in call ``s`` sees what call ``s`` wrote there (by a staging
copy or a peer's push or a reduction), never an earlier or a later call's bytes; and every
run finishes (no deadlock). With the two halves made one, the same check must fail in some
run: it sees the overwrite it guards against.

A push all-gather+GEMM pipeline (``tp_push``: :mod:`conccl.schedule.pipeline`) reads its peers' shards
where they pushed them, in its own workspace, in its GEMM steps (``Compute.ws_offset``), which
wait on marks (a rank's own words) the control stream writes: those reads are checked the same
way, and the counter-tests drop the marks or the whole call's wait before its release.

And for outputs (one tensor per rank, reused by every call, as a loop's): every read of a
peer's output byte (a push all-gather's own chunk read back, ``own_chunk_via_peer``) sees
this call's bytes, and once a rank's call ends its caller takes the output (marked so: a peer
reading it later fails); a push all-gather's output is whole when its call ends.
"""
from __future__ import annotations

import random

import pytest

from conccl.collectives.all_gather import own_chunk_via_peer, plan_all_gather, plan_one_shot_all_gather
from conccl.collectives.all_reduce import plan_all_reduce, plan_one_shot_all_reduce
from conccl.collectives.all_to_all import equal_split_matrix, plan_all_to_all, plan_one_shot_all_to_all
from conccl.collectives.reduce_scatter import plan_one_shot_reduce_scatter, plan_reduce_scatter
from conccl.schedule.pipeline import TPSchedule, gather_then_gemm, gemm_then_scatter
from conccl.schedule.base import (DOUBLE_BUFFER_MAX_BYTES, MARK_WORDS, Algorithm, AwaitMark, Buf, Compute, Copy, Mark, Reduce,
                             SetSignal, StreamMode, WaitSignal, signal_pad_words, signal_word, workspace_half)

CAPACITY = 1 << 13  # the model's workspace per rank: two halves of 4 KiB
TP_ROW_BYTES = 16  # a push pipeline's rows: 4 a shard (64 bytes), 64 in tp_push_big (1 KiB)


def _plans(world, rank, kind, mode):
    if kind.startswith("tp_push"):  # the pipeline's own stream mode (per peer), whatever the others'
        rows = 64 if kind == "tp_push_big" else 4
        flat = plan_all_gather(world, rank, rows * TP_ROW_BYTES, stream_mode=StreamMode.PER_PEER,
                               algorithm=Algorithm.STAGED_PUSH)
        return gather_then_gemm(flat, TPSchedule(push=True, gemm_streams=2 if kind == "tp_push_s2" else 1), rows,
                                TP_ROW_BYTES, keep_own=False)
    if kind.startswith("tp_rs"):  # a GEMM+reduce-scatter pipeline: its sum behind the last GEMM step
        rows = 64 if kind == "tp_rs_big" else 4
        tp = TPSchedule(pieces=2, gemm_streams=2) if kind == "tp_rs_p2s2" else TPSchedule()
        flat = plan_reduce_scatter(world, rank, rows * TP_ROW_BYTES, "float32", stream_mode=tp.stream_mode())
        return gemm_then_scatter(flat, tp, rows, TP_ROW_BYTES)
    if kind.startswith("os_"):  # one-shot: one slot whatever the mode (conccl.collectives.one_shot)
        return {"os_ag": lambda: plan_one_shot_all_gather(world, rank, 64, False),
                "os_a2a": lambda: plan_one_shot_all_to_all(world, rank, equal_split_matrix(world, 32)),
                "os_rs": lambda: plan_one_shot_reduce_scatter(world, rank, 64, "float32", 1.0),
                "os_ar": lambda: plan_one_shot_all_reduce(world, rank, 256, "float32", 1.0)}[kind]()
    if kind == "ag":
        return plan_all_gather(world, rank, 64, stream_mode=mode)  # plain tensors: staged
    if kind in ("ag_push", "ag_push_via"):  # into the peers' outputs; the own chunk read back from one
        plan = plan_all_gather(world, rank, 64, stream_mode=mode, algorithm=Algorithm.PUSH, output_symmetric=True)
        return own_chunk_via_peer(plan) if kind == "ag_push_via" else plan
    if kind == "ag_sym":
        return plan_all_gather(world, rank, 64, stream_mode=mode, input_symmetric=True)
    if kind == "ag_sp":  # pushes into the peers' workspace, copied out there
        return plan_all_gather(world, rank, 64, stream_mode=mode, algorithm=Algorithm.STAGED_PUSH)
    if kind == "ag_sp_big":  # whole under the small_double_buffer fixture
        return plan_all_gather(world, rank, 1024, stream_mode=mode, algorithm=Algorithm.STAGED_PUSH)
    if kind == "a2a":
        return plan_all_to_all(world, rank, equal_split_matrix(world, 32), stream_mode=mode)
    if kind == "rs":
        return plan_reduce_scatter(world, rank, 64, "float32", stream_mode=mode)
    if kind == "rs_big":  # whole under the small_double_buffer fixture
        return plan_reduce_scatter(world, rank, 1024, "float32", stream_mode=mode)
    if kind == "ar_big":
        return plan_all_reduce(world, rank, 1024, 4, "float32", stream_mode=mode)
    if kind in ("ar_1p", "ar_1p_big"):  # one pass: the whole input pushed into every peer's workspace
        return plan_all_reduce(world, rank, 16 if kind == "ar_1p" else 256, 4, "float32", stream_mode=mode,
                               algorithm=Algorithm.STAGED_PUSH)
    return plan_all_reduce(world, rank, 64, 4, "float32", stream_mode=mode)


def op_bytes(op, rank):
    """(reads, writes) of a Copy or Reduce that ``rank`` runs, each [(rank, buf, offset, nbytes)]
    (a one-shot reduction's operands are the peers': ``src_ranks``)."""
    if isinstance(op, Copy):
        t = op.transfer
        return [(t.src_rank, t.src, t.src_offset, t.nbytes)], [(t.dst_rank, t.dst, t.dst_offset, t.nbytes)]
    ranks = op.src_ranks or (rank,) * len(op.srcs)
    return ([(who, buf, off, op.nbytes) for who, (buf, off) in zip(ranks, op.srcs)],
            [(rank, op.dst[0], op.dst[1], op.nbytes)])


OUTPUT_BYTES = {"ag_push": 64, "ag_push_via": 64}  # per rank: outputs checked whole at the call's end


def _run(world, calls, mode, seed, half=workspace_half, plans=None):
    """Run every rank's schedules of ``calls`` in a random interleaving; return the first
    stale or early workspace or output read, or incomplete output, as a string, or None.
    ``plans``: every rank's schedules (default: from ``calls``)."""
    rng = random.Random(seed)
    slow = rng.randrange(world) if seed % 2 else None
    plans = plans or [[_plans(world, r, kind, mode) for kind in calls] for r in range(world)]
    outs: dict = {}  # (rank, output byte) -> the call that wrote it, or -s: the caller took it after call s
    pads = [[0] * signal_pad_words(world) for _ in range(world)]
    marks = [[0] * MARK_WORDS for _ in range(world)]  # each rank's own mark words
    tags: dict = {}  # (rank, workspace byte) -> the call that wrote it
    call = [0] * world  # each rank's call under way (index into calls)
    pcs = [None] * world  # each rank's program counters of that call's slots

    def ws_bytes(r, s, off, n, schedule):
        base = half(s, CAPACITY) if schedule.double_buffered else 0
        return [(r, base + off + i) for i in range(0, n, 8)]  # 8-byte granules: enough to see overlap

    def step(r, k) -> str | None:
        s = call[r] + 1  # sequence numbers start at 1
        schedule = plans[r][call[r]]
        op = schedule.slots[k][pcs[r][k]]
        if isinstance(op, WaitSignal):
            if pads[r][signal_word(op.kind, op.peer, world)] < s + op.seq_delta:
                return "blocked"
        elif isinstance(op, SetSignal):
            word = signal_word(op.kind, r, world)
            pads[op.peer][word] = max(pads[op.peer][word], s + op.seq_delta)
        elif isinstance(op, AwaitMark):
            if marks[r][op.word] < s:
                return "blocked"
        elif isinstance(op, Mark):
            marks[r][op.word] = s
        elif isinstance(op, Compute):  # a GEMM step: reads its rows where the peer pushed them
            if op.ws_offset is not None:
                for g in ws_bytes(r, s, op.ws_offset, (op.row_end - op.row_start) * TP_ROW_BYTES, schedule):
                    if tags.get(g) != s:
                        return f"rank {r} call {s} ({calls[call[r]]}) GEMM step read workspace byte {g[1]} " \
                               f"holding call {tags.get(g)}'s bytes"
        elif isinstance(op, (Copy, Reduce)):
            reads, writes = op_bytes(op, r)
            for who, buf, off, n in reads:
                if buf is Buf.OUTPUT and who != r:
                    for i in range(off, off + n, 8):
                        if outs.get((who, i)) != s:
                            return f"rank {r} call {s} ({calls[call[r]]}) read rank {who}'s output byte {i} " \
                                   f"holding {outs.get((who, i))}"
                if buf is Buf.WORKSPACE:
                    for g in ws_bytes(who, s, off, n, schedule):
                        if tags.get(g) != s:
                            return f"rank {r} call {s} ({calls[call[r]]}) read rank {who}'s workspace byte {g[1]} " \
                                   f"holding call {tags.get(g)}'s bytes"
            for who, buf, off, n in writes:
                if buf is Buf.OUTPUT:
                    for i in range(off, off + n, 8):
                        outs[(who, i)] = s
                if buf is Buf.WORKSPACE:
                    for g in ws_bytes(who, s, off, n, schedule):
                        tags[g] = s
        pcs[r][k] += 1
        return None

    for _ in range(200_000):
        runnable = []
        for r in range(world):
            if call[r] == len(calls):
                continue
            if pcs[r] is None or all(pc == len(ops) for pc, ops in zip(pcs[r], plans[r][call[r]].slots)):
                if pcs[r] is not None:  # the call ended on every stream: the next one starts
                    s, kind = call[r] + 1, calls[call[r]]
                    if kind in OUTPUT_BYTES:
                        missing = [i for i in range(0, world * OUTPUT_BYTES[kind], 8) if outs.get((r, i)) != s]
                        if missing:
                            return f"rank {r} call {s} ({kind}) ended with output byte {missing[0]} not written"
                    for key in [key for key in outs if key[0] == r]:
                        outs[key] = -s  # the caller reads and reuses its output
                    call[r] += 1
                    if call[r] == len(calls):
                        continue
                pcs[r] = [0] * plans[r][call[r]].num_slots
            runnable += [(r, k) for k, ops in enumerate(plans[r][call[r]].slots) if pcs[r][k] < len(ops)]
        if not runnable:
            return None
        rng.shuffle(runnable)
        if slow is not None and rng.random() < 0.9:  # the slow rank goes last when it can
            runnable.sort(key=lambda rk: rk[0] == slow)
        for r, k in runnable:
            result = step(r, k)
            if result != "blocked":
                if result is not None:
                    return result
                break
        else:
            return f"deadlock: every rank blocked at calls {call}"
    return "did not finish"


KINDS = ("ag", "rs", "ar", "ar_1p", "a2a", "ag_sym", "ag_sp", "ag_push", "ag_push_via", "os_ag", "os_a2a", "os_rs",
         "os_ar", "tp_push", "tp_push_s2", "tp_rs", "tp_rs_p2s2")


@pytest.mark.parametrize("mode", list(StreamMode))
@pytest.mark.parametrize("world", [2, 3, 4])
def test_no_read_sees_another_calls_workspace_bytes(world, mode):
    for seed in range(40):
        rng = random.Random(seed)
        calls = [rng.choice(KINDS) for _ in range(8)]
        assert _run(world, calls, mode, seed) is None, (world, mode, seed, calls)


def test_the_model_sees_an_overwrite_with_one_half():
    """The counter-test: both halves one (every call at offset 0). Some run must go wrong,
    for the all-gather's staging and for the reduce-scatter's pushes alike."""
    for calls in (["ag"] * 6, ["rs"] * 6, ["ag_sp"] * 6, ["ar_1p"] * 6):
        found = [_run(2, calls, StreamMode.PER_PEER, seed, half=lambda seq, capacity: 0) for seed in range(40)]
        assert any(f and "holding call" in f for f in found), calls


def _read_back_after_done(plan):
    """``plan`` (own_chunk_via_peer's) with its read-back moved behind the DONE it precedes."""
    import dataclasses

    slots = []
    for ops in plan.slots:
        ops = list(ops)
        back = [i for i, op in enumerate(ops) if isinstance(op, Copy) and op.transfer.src_rank != plan.rank]
        if back:
            op = ops.pop(back[0])
            done = max(i for i, x in enumerate(ops) if isinstance(x, SetSignal))
            ops.insert(done + 1, op)
        slots.append(tuple(ops))
    return dataclasses.replace(plan, slots=tuple(slots))


@pytest.mark.parametrize("world", [2, 3])
def test_the_model_sees_a_read_back_after_the_done_that_frees_the_peer(world):
    """The counter-test for own_chunk_via_peer: with the read-back after the DONE to the peer
    it reads, some run reads the peer's output after the peer's caller took it back (or the
    peer's next call wrote it); where the plan has it (before that DONE), none does."""
    for mode in StreamMode:
        calls = ["ag_push_via"] * 5
        plans = [[_read_back_after_done(_plans(world, r, "ag_push_via", mode)) for _ in calls] for r in range(world)]
        found = [_run(world, calls, mode, seed, plans=plans) for seed in range(40)]
        assert any(f and "output byte" in f for f in found), mode
        assert all(_run(world, calls, mode, seed) is None for seed in range(40)), mode


def test_the_model_workspace_fits_the_plans():
    for kind in KINDS:
        p = _plans(4, 0, kind, StreamMode.PER_PEER)
        assert p.workspace_bytes <= CAPACITY // 2 and p.workspace_bytes <= DOUBLE_BUFFER_MAX_BYTES


@pytest.fixture
def small_double_buffer(monkeypatch):
    """Calls over 1 KiB of workspace take the whole workspace (rs_big, ar_big here: 1 KiB a
    rank), the others stay double-buffered: the mix is checked."""
    import conccl.schedule.base as schedule

    plans = (plan_all_gather, plan_all_reduce, plan_all_to_all, plan_reduce_scatter)
    for plan in plans:
        plan.cache_clear()
    monkeypatch.setattr(schedule, "DOUBLE_BUFFER_MAX_BYTES", 1024)
    yield
    for plan in plans:
        plan.cache_clear()


WHOLE_KINDS = KINDS + ("rs_big", "ar_big", "ag_sp_big", "ar_1p_big", "tp_push_big", "tp_rs_big")


@pytest.mark.long  # ~5 s (2 ranks) and ~15 s (3) of seeded runs: the long tier
@pytest.mark.parametrize("world", [2, 3])
def test_whole_and_double_buffered_calls_mix(world, small_double_buffer):
    assert not _plans(world, 0, "rs_big", StreamMode.BATCH).double_buffered
    assert not _plans(world, 0, "ar_big", StreamMode.BATCH).double_buffered
    assert _plans(world, 0, "rs", StreamMode.BATCH).double_buffered
    assert _plans(world, 0, "ar", StreamMode.BATCH).double_buffered
    assert not _plans(world, 0, "ag_sp_big", StreamMode.BATCH).double_buffered
    assert _plans(world, 0, "ag_sp", StreamMode.BATCH).double_buffered
    assert not _plans(world, 0, "ar_1p_big", StreamMode.BATCH).double_buffered
    assert not _plans(world, 0, "tp_rs_big", StreamMode.BATCH).double_buffered
    assert _plans(world, 0, "ar_1p", StreamMode.BATCH).double_buffered
    for mode in StreamMode:
        # a whole call first, then pushes into the halves it used (found in review: call 2's
        # pushes once waited for a FREE the zeroed pad already satisfied)
        for first in ("rs_big", "ar_big", "ag_sp_big", "ar_1p_big", "tp_push_big", "tp_rs_big"):
            for then in ("rs", "ar", "os_ar", "ag_sp", "ar_1p", "tp_push", "tp_rs"):
                for seed in range(30):
                    assert _run(world, [first, then, then, first, then], mode, seed) is None, (world, mode, seed, first,
                                                                                               then)
        for seed in range(40):
            rng = random.Random(seed)
            calls = [rng.choice(WHOLE_KINDS) for _ in range(8)]
            assert _run(world, calls, mode, seed) is None, (world, mode, seed, calls)


def _without(plan, drop):
    """``plan`` with the ops ``drop(slot, op)`` names taken out."""
    import dataclasses

    return dataclasses.replace(plan, slots=tuple(tuple(op for op in ops if not drop(k, op))
                                                 for k, ops in enumerate(plan.slots)))


@pytest.mark.parametrize("world", [2, 3])
def test_the_model_sees_a_push_pipeline_without_its_waits(world, small_double_buffer):
    """The counter-tests for the push pipeline: without the marks its GEMM steps wait on, a
    step reads a peer's shard before it landed; without the whole call's wait for its GEMM
    steps before its release, a double-buffered push after it overwrites what a step still
    reads. With the plans as built, no run does either."""
    assert not _plans(world, 0, "tp_push_big", StreamMode.PER_PEER).double_buffered
    assert _plans(world, 0, "tp_push", StreamMode.PER_PEER).double_buffered
    cases = (
        (["tp_push"] * 5, lambda k, op: isinstance(op, AwaitMark)),
        (["tp_push_big", "rs", "ag_sp", "tp_push_big", "rs", "tp_push"],
         lambda k, op: k == 0 and isinstance(op, AwaitMark)),
    )
    for calls, drop in cases:
        plans = [[_without(_plans(world, r, kind, StreamMode.PER_PEER), drop) if kind.startswith("tp_push") else
                  _plans(world, r, kind, StreamMode.PER_PEER) for kind in calls] for r in range(world)]
        found = [_run(world, calls, StreamMode.PER_PEER, seed, plans=plans) for seed in range(60)]
        assert any(f and "GEMM step read" in f for f in found), calls
        assert all(_run(world, calls, StreamMode.PER_PEER, seed) is None for seed in range(60)), calls
