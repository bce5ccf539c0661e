"""CPU multi-process tier for captured calls (conccl.schedule.captured): the reference executor records
calls made inside its capture() and replays them, as a CUDA graph would, on graph slots of
their own; the results must be right at every replay, with inputs changed between replays
and eager calls between them."""
from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from torch.distributed import ReduceOp  # noqa: E402

from conccl import Algorithm, StreamMode  # noqa: E402
from conccl.collectives.all_gather import ALL_GATHER  # noqa: E402
from conccl.collectives.all_reduce import ALL_REDUCE  # noqa: E402
from conccl.collectives.all_to_all import ALL_TO_ALL  # noqa: E402
from conccl.collectives.reduce_scatter import REDUCE_SCATTER  # noqa: E402
from conccl.errors import CollectiveError  # noqa: E402
from conccl.testing import spawn  # noqa: E402
from conccl.schedule.base import Buf, ResetSignal  # noqa: E402


def _fill(t, rank, step, salt):
    g = torch.Generator().manual_seed(rank * 1000 + step * 10 + salt)
    t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))


def _graph_of_every_collective(comm, mode, replays, jitter, one_shot=False):
    w, r = comm.world, comm.rank
    comm.options.stream_mode = mode
    comm.options.one_shot_below = (1 << 20) if one_shot else 0
    ex = comm.executor
    rng = random.Random(r)
    # the graph's buffers (a captured call keeps its tensors, as in CUDA graphs)
    ag_in, ag_out = torch.empty(7), torch.empty(7 * w)
    a2a_in, a2a_out = torch.empty(3 * w), torch.empty(3 * w)
    rs_in, rs_out = torch.empty(5 * w, dtype=torch.bfloat16), torch.empty(5, dtype=torch.bfloat16)
    ar = torch.empty(13)
    sym_out = ex.empty((7 * w,), torch.float32)  # a peer-reachable output: the all-gather pushes
    persistent = comm.persistent(ALL_GATHER, torch.empty(7 * w), ag_in, ())  # agreed eagerly, started in the graph
    captured = []  # whether each captured call is one-shot
    real_capture_call = ex.capture_call
    ex.capture_call = lambda schedule, *a, **k: (captured.append(schedule.one_shot), real_capture_call(schedule, *a, **k))
    with ex.capture() as graph:
        persistent.start()
        works = [comm.call(ALL_GATHER, ag_out, ag_in, (), route=one_shot),  # route: a public function's call
                 comm.call(ALL_TO_ALL, a2a_out, a2a_in, (None, None), route=one_shot),
                 comm.call(REDUCE_SCATTER, rs_out, rs_in, (ReduceOp.SUM,), route=one_shot),
                 comm.call(ALL_REDUCE, ar, ar, (ReduceOp.AVG,), route=one_shot),
                 comm.call(ALL_GATHER, sym_out, ag_in, (), route=one_shot)]
    assert comm.seq == 0 and comm.graph_slots == 6  # capturing took no sequence number
    assert captured == [False] + [one_shot] * 5, captured  # the persistent op's start stays on copy engines
    # what each captured call's Work says ran it
    assert [w_.path for w_ in works] == ["one_shot" if one_shot else "copy_engines"] * 5, [w_.path for w_ in works]
    ok = []
    for step in range(replays):
        # every rank's inputs for this replay (each rank knows all of them, for the expected values)
        ins = {name: [] for name in ("ag", "a2a", "rs", "ar")}
        for p in range(w):
            for name, t in (("ag", ag_in), ("a2a", a2a_in), ("rs", rs_in), ("ar", ar)):
                x = torch.empty_like(t)
                _fill(x, p, step, len(name))
                ins[name].append(x)
        ag_in.copy_(ins["ag"][r]), a2a_in.copy_(ins["a2a"][r]), rs_in.copy_(ins["rs"][r]), ar.copy_(ins["ar"][r])
        if jitter:
            time.sleep(rng.random() * 0.01)  # ranks reach the replay at different times
        ex.replay(graph)
        ok.append(torch.equal(ag_out, ALL_GATHER.reference(ins["ag"], r))
                  and torch.equal(persistent.output, ALL_GATHER.reference(ins["ag"], r))
                  and torch.equal(sym_out, ALL_GATHER.reference(ins["ag"], r))
                  and torch.equal(a2a_out, ALL_TO_ALL.reference(ins["a2a"], r))
                  and torch.equal(rs_out, REDUCE_SCATTER.reference(ins["rs"], r))
                  and torch.equal(ar, ALL_REDUCE.reference(ins["ar"], r, [(ReduceOp.AVG,)] * w)))
        # an eager call between replays: its own words and workspace, untouched by the graph's
        out = torch.empty(2 * w)
        comm.call(ALL_GATHER, out, torch.full((2,), float(r + step)), ())
        ok.append(torch.equal(out, torch.arange(w).repeat_interleave(2).float() + step))
    return ok


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", [StreamMode.BATCH, StreamMode.PER_PEER, "one_shot"])
def test_a_captured_graph_replays_right_with_new_inputs_and_eager_calls_between(world, mode):
    replays = 4
    one_shot = mode == "one_shot"  # every call a one-shot schedule (conccl.collectives.one_shot)
    for ok in spawn(world, _graph_of_every_collective, StreamMode.BATCH if one_shot else mode, replays, world == 3,
                    one_shot):
        assert ok == [True] * (2 * replays), ok


def _capture_on_one_rank_only(comm):
    out = torch.full((4 * comm.world,), 3.0)
    try:
        if comm.rank == 0:
            with comm.executor.capture():
                comm.call(ALL_GATHER, out, torch.ones(4), ())
        else:
            comm.call(ALL_GATHER, out, torch.ones(4), ())
    except CollectiveError as e:
        return "CUDA graph" in str(e) and "nothing was moved" in str(e) and bool((out == 3.0).all())
    return "no error"


def test_a_call_captured_on_one_rank_and_eager_on_another_is_refused_everywhere():
    assert spawn(2, _capture_on_one_rank_only) == [True, True]


def _slow_reducer(comm, replays):
    """Captured reduce-scatter and all-reduce, replayed with new inputs, rank 0 slow to read its
    workspace (a random sleep before each of its sums): a peer that pushed into that workspace
    again before rank 0 had read it would change rank 0's result."""
    w, r = comm.world, comm.rank
    ex = comm.executor
    rng = random.Random(7 + r)
    if r == 0:
        real_reduce, real_bytes = ex._reduce, ex._bytes

        def slow(*a, **k):
            time.sleep(rng.random() * 0.004)
            return real_reduce(*a, **k)

        def slow_own_workspace(rank, buf, *a):  # a staged push's copy out of it, say
            if rank == r and buf is Buf.WORKSPACE:
                time.sleep(rng.random() * 0.002)
            return real_bytes(rank, buf, *a)
        ex._reduce, ex._bytes = slow, slow_own_workspace
    rs_in, rs_out = torch.empty(5 * w), torch.empty(5)
    ar, ar_out = torch.empty(7 * w), torch.empty(7 * w)
    ag_in, ag_out = torch.empty(6), torch.empty(6 * w)
    # one call per graph: nothing else between two replays of a call holds a fast rank back
    with ex.capture() as rs_graph:
        comm.call(REDUCE_SCATTER, rs_out, rs_in, (ReduceOp.SUM,))
    with ex.capture() as ar_graph:  # one pass (the automatic choice at this size)
        comm.call(ALL_REDUCE, ar, ar, (ReduceOp.SUM,))
    with ex.capture() as ar2_graph:
        comm.call(ALL_REDUCE, ar, ar, (ReduceOp.SUM,), algorithm=Algorithm.PUSH)  # two passes
    with ex.capture() as ar3_graph:  # one pass out of place: its pushes on a stream per peer where asked
        comm.call(ALL_REDUCE, ar_out, ar, (ReduceOp.SUM,), stream_mode=StreamMode.PER_PEER)
    with ex.capture() as ag_graph:
        comm.call(ALL_GATHER, ag_out, ag_in, (), algorithm=Algorithm.STAGED_PUSH)
    ok = []
    for graph, t, coll, args in ((rs_graph, rs_in, REDUCE_SCATTER, None), (ar_graph, ar, ALL_REDUCE, [(ReduceOp.SUM,)] * w),
                                 (ar2_graph, ar, ALL_REDUCE, [(ReduceOp.SUM,)] * w),
                                 (ar3_graph, ar, "ar_out", [(ReduceOp.SUM,)] * w), (ag_graph, ag_in, ALL_GATHER, None)):
        result = ar_out if coll == "ar_out" else {REDUCE_SCATTER: rs_out, ALL_REDUCE: ar, ALL_GATHER: ag_out}[coll]
        coll = ALL_REDUCE if coll == "ar_out" else coll
        for step in range(replays):  # replays of one graph back to back
            ins = []
            for p in range(w):
                x = torch.empty_like(t)
                _fill(x, p, step, coll.name == "all_reduce")
                ins.append(x)
            t.copy_(ins[r])
            ex.replay(graph)
            ok.append(torch.equal(result, coll.reference(ins, r, args)))
    return ok


@pytest.mark.parametrize("world", [2, 3])
def test_a_fast_rank_never_pushes_into_a_slow_ranks_workspace_before_it_was_read(world):
    for ok in spawn(world, _slow_reducer, 12):
        assert ok == [True] * 60, ok


def _mixed_modes(comm, replays):
    """Every rank captures the same calls, each in a stream mode of its own (rank r:
    BATCH, PER_PEER, SINGLE, ...); an all-reduce of one element leaves most chunks empty."""
    w, r = comm.world, comm.rank
    modes = (StreamMode.BATCH, StreamMode.PER_PEER, StreamMode.SINGLE)
    comm.options.stream_mode = modes[r % len(modes)]
    rs_in, rs_out = torch.empty(3 * w), torch.empty(3)
    one, ar, ar2 = torch.empty(1), torch.empty(5 * w + 1), torch.empty(5 * w + 1)
    ar3, ar_out = torch.empty(3 * w + 2), torch.empty(3 * w + 2)
    with comm.executor.capture() as graph:
        comm.call(REDUCE_SCATTER, rs_out, rs_in, (ReduceOp.SUM,))
        comm.call(ALL_REDUCE, one, one, (ReduceOp.SUM,))
        comm.call(ALL_REDUCE, ar, ar, (ReduceOp.AVG,))  # one pass
        comm.call(ALL_REDUCE, ar2, ar2, (ReduceOp.AVG,), algorithm=Algorithm.PUSH)  # two passes
        comm.call(ALL_REDUCE, ar_out, ar3, (ReduceOp.SUM,))  # one pass out of place: in this rank's mode
    ok = []
    for step in range(replays):
        ins = {name: [] for name in ("rs", "one", "ar", "ar2", "ar3")}
        for q in range(w):
            for name, t in (("rs", rs_in), ("one", one), ("ar", ar), ("ar2", ar2), ("ar3", ar3)):
                x = torch.empty_like(t)
                _fill(x, q, step, len(name))
                ins[name].append(x)
        rs_in.copy_(ins["rs"][r]), one.copy_(ins["one"][r]), ar.copy_(ins["ar"][r]), ar2.copy_(ins["ar2"][r])
        ar3.copy_(ins["ar3"][r])
        comm.executor.replay(graph)
        ok.append(torch.equal(rs_out, REDUCE_SCATTER.reference(ins["rs"], r))
                  and torch.equal(one, ALL_REDUCE.reference(ins["one"], r, [(ReduceOp.SUM,)] * w))
                  and torch.equal(ar, ALL_REDUCE.reference(ins["ar"], r, [(ReduceOp.AVG,)] * w))
                  and torch.equal(ar2, ALL_REDUCE.reference(ins["ar2"], r, [(ReduceOp.AVG,)] * w))
                  and torch.equal(ar_out, ALL_REDUCE.reference(ins["ar3"], r, [(ReduceOp.SUM,)] * w)))
    return ok


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_that_capture_in_different_stream_modes_replay_right(world):
    for ok in spawn(world, _mixed_modes, 4):
        assert ok == [True] * 4, ok


def _reordered(comm, how, replays):
    """``_slow_reducer`` and ``_mixed_modes`` with every captured schedule's ops in the order the
    CUDA lowering runs them with spin waits (``spin``: the waits before a reduction, then the
    reduction, then the resets of those words; cuda_lowering.spin_before_reductions), or with
    every reset moved to the end of its stream (``late``: the counter-test, which must fail)."""
    import dataclasses

    from conccl.executors.cuda.lowering import _Spin, spin_before_reductions

    def spun(ops):
        return [x for op in spin_before_reductions(ops) for x in (op.waits if isinstance(op, _Spin) else (op,))]

    def late(ops):
        return [op for op in ops if not isinstance(op, ResetSignal)] + [op for op in ops if isinstance(op, ResetSignal)]

    ex = comm.executor
    capture = ex.capture_call

    def reorder(schedule, *a, **k):
        slots = tuple(tuple({"spin": spun, "late": late}[how](list(ops))) for ops in schedule.slots)
        return capture(dataclasses.replace(schedule, slots=slots), *a, **k)

    ex.capture_call = reorder
    return _slow_reducer(comm, replays) + _mixed_modes(comm, replays)


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.long)])  # 3: the long tier (a 10 s wait)
def test_the_spin_waits_order_replays_right_and_late_resets_would_not(world):
    """The resets the spin-wait lowering moves behind the reduction stay before every signal
    the peers wait on to write those words again: the captured calls replay right with a slow
    reducer and mixed stream modes. Moving the resets to the end of their streams lets a peer's
    next signal be erased, which the same replays see (a hang or a wrong result)."""
    replays = 6
    for ok in spawn(world, _reordered, "spin", replays):
        assert ok == [True] * (6 * replays), ok
    try:
        results = spawn(world, _reordered, "late", replays, timeout=timedelta(seconds=10), join_timeout_s=30)
    except RuntimeError as e:  # a rank's replay stuck on a signal a reset erased
        assert "timed out" in str(e), e
    else:
        assert any(not all(ok) for ok in results), results
