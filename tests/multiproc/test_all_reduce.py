"""CPU multi-process tier for the copy-engine all-reduce: the reference executor runs the same
schedule (push into peers' workspaces, reduce one chunk, pull every reduced chunk) as the GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.distributed import ReduceOp, _make_nccl_premul_sum  # noqa: E402

from conccl import Algorithm, StreamMode  # noqa: E402
from conccl.collectives.all_gather import ALL_GATHER  # noqa: E402
from conccl.collectives.all_reduce import ALL_REDUCE  # noqa: E402
from conccl.collectives.reduce_scatter import REDUCE_SCATTER  # noqa: E402
from conccl.errors import CollectiveError, InvalidArgument  # noqa: E402
from conccl.testing import spawn  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _inputs(world: int, n: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype) for _ in range(world)]


def _bits(t):
    return t.contiguous().view(torch.uint8)


def _ran(comm):
    """The algorithms of the schedules ``comm``'s executor runs, in order (a spy)."""
    ran, run = [], comm.executor.run

    def spy(schedule, *a, **k):
        ran.append(schedule.algorithm)
        return run(schedule, *a, **k)

    comm.executor.run = spy
    return ran


def _ar(comm, n, dtype, op, mode, in_place, seed, algorithm=None):
    w, r = comm.world, comm.rank
    comm.options.stream_mode = mode
    ran = _ran(comm)
    inputs = _inputs(w, n, dtype, seed)
    inp = inputs[r].clone()
    out = inp if in_place else torch.full((n,), float("nan"), dtype=dtype)
    comm.call(ALL_REDUCE, out, inp, (op,), algorithm=algorithm)
    expected = ALL_REDUCE.reference(inputs, r, [(op,)] * w)
    naive = inputs[0] + inputs[1] if w == 2 and op is None else None
    return (torch.equal(_bits(out), _bits(expected)),
            None if naive is None else torch.equal(_bits(out), _bits(naive)), ran)


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", [None, Algorithm.PUSH, Algorithm.STAGED_PUSH])
def test_all_reduce_equals_the_reference(world, dtype, algorithm):
    # counts that divide by nothing convenient, one smaller than the world, and none; in place
    # on a branch per peer (one pass: the reduction must not overwrite what a push still reads)
    for n, op, mode, in_place in ((1001, None, StreamMode.PER_PEER, True), (3, ReduceOp.AVG, StreamMode.BATCH, False),
                                  (257, _make_nccl_premul_sum(0.3), StreamMode.SINGLE, True),
                                  (0, ReduceOp.SUM, StreamMode.BATCH, True)):
        for exact, naive, ran in spawn(world, _ar, n, dtype, op, mode, in_place, 7 + n, algorithm):
            assert exact, (world, dtype, n, op, mode, in_place)
            # two ranks: one addition, the same bits as a plain a + b (and as NCCL's)
            assert naive in (None, True), (world, dtype, n)
            # small calls run in one pass unless two are asked for
            assert ran == [algorithm or Algorithm.STAGED_PUSH], (ran, algorithm)


def _group_default_ignored(comm):
    ran = _ran(comm)
    out = []
    for default in (Algorithm.PUSH, Algorithm.STAGED_PUSH, Algorithm.PULL):
        comm.options.algorithm = default  # meant for the gathers: the all-reduce keeps its choice by size
        inputs = _inputs(comm.world, 40, torch.float32, 3)
        buf = inputs[comm.rank].clone()
        comm.call(ALL_REDUCE, buf, buf, (None,))
        out.append(torch.equal(buf, ALL_REDUCE.reference(inputs, comm.rank)))
    comm.call(ALL_REDUCE, buf, buf, (None,), algorithm=Algorithm.PUSH)  # asked per call: kept
    return out, [a.value for a in ran]


def test_a_group_default_algorithm_does_not_choose_the_all_reduces_form():
    for ok, ran in spawn(2, _group_default_ignored):
        assert ok == [True] * 3
        assert ran == ["staged_push"] * 3 + ["push"], ran


def _mixed_back_to_back(comm):
    """All-reduces between the other collectives on one group: every call reuses the workspace
    the one before used differently (a staged gather's input, a reduce-scatter's slots)."""
    w, r = comm.world, comm.rank
    ok = []
    for call in range(3):
        inputs = _inputs(w, 37 + call, torch.float32, 50 + call)
        buf = inputs[r].clone()
        comm.call(ALL_REDUCE, buf, buf, (None,))
        ok.append(torch.equal(buf, ALL_REDUCE.reference(inputs, r)))
        gathered = torch.empty(w * 5)
        comm.call(ALL_GATHER, gathered, torch.full((5,), float(r)), ())
        ok.append(torch.equal(gathered, torch.arange(w).repeat_interleave(5).float()))
        rs_in = _inputs(w, w * 4, torch.float32, 70 + call)
        out = torch.empty(4)
        comm.call(REDUCE_SCATTER, out, rs_in[r], (None,))
        ok.append(torch.equal(out, REDUCE_SCATTER.reference(rs_in, r)))
    return ok


def test_all_reduce_mixed_with_other_collectives_on_one_group():
    assert spawn(3, _mixed_back_to_back) == [[True] * 9] * 3


def _persistent_and_async(comm):
    w, r = comm.world, comm.rank
    buf = torch.zeros(11, dtype=torch.bfloat16)
    op = comm.persistent(ALL_REDUCE, buf, buf, (ReduceOp.AVG,))
    ok = []
    for step in range(4):
        inputs = _inputs(w, 11, torch.bfloat16, step)
        buf.copy_(inputs[r])
        work = op.start(async_op=step % 2 == 1)
        if work is not None:
            work.wait()
        ok.append(torch.equal(buf, ALL_REDUCE.reference(inputs, r, [(ReduceOp.AVG,)] * w)))
    return ok


def test_persistent_and_async_starts():
    assert spawn(2, _persistent_and_async) == [[True] * 4] * 2


def _mismatches(comm):
    out = []
    # a different op on one rank
    buf = torch.full((4,), 3.0)
    try:
        comm.call(ALL_REDUCE, buf, buf, (ReduceOp.SUM if comm.rank else ReduceOp.AVG,))
        out.append("no error")
    except CollectiveError as e:
        out.append("reduction op" in str(e) and "nothing was moved" in str(e) and bool((buf == 3.0).all()))
    # a different count on one rank
    buf = torch.full((4 + comm.rank,), 3.0)
    try:
        comm.call(ALL_REDUCE, buf, buf, (None,))
        out.append("no error")
    except CollectiveError as e:
        out.append("nothing was moved" in str(e) and bool((buf == 3.0).all()))
    return out


def test_a_rank_with_another_op_or_count_is_refused_everywhere_before_anything_moves():
    assert spawn(3, _mismatches) == [[True, True]] * 3


def _bad_calls(comm):
    errors = []
    x = torch.empty(8)
    for out, inp, args, kw in ((torch.empty(4), torch.empty(5), (None,), {}),                       # sizes
                               (torch.empty(4, dtype=torch.int32), torch.empty(4, dtype=torch.int32), (None,), {}),
                               (torch.empty(4), torch.empty(4), (ReduceOp.MAX,), {}),                # op
                               (x[:4], x[2:6], (None,), {}),                                         # partial overlap
                               (torch.empty(4), torch.empty(4), (None,), {"algorithm": Algorithm.PULL})):
        try:
            comm.call(ALL_REDUCE, out, inp, args, **kw)
            errors.append("no error")
        except InvalidArgument as e:
            errors.append(type(e).__name__)
    return errors, comm.seq


def test_bad_calls_raise_before_anything_moves():
    assert spawn(2, _bad_calls) == [(["InvalidArgument"] * 5, 0)] * 2
