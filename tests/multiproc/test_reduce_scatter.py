"""CPU multi-process tier for the copy-engine reduce-scatter: the reference executor runs the
same schedule (copies into peers' workspaces, signals, then one reduction) as the GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.distributed import ReduceOp, _make_nccl_premul_sum  # noqa: E402

from conccl import Algorithm, StreamMode  # noqa: E402
from conccl.collectives.reduce_scatter import REDUCE_SCATTER  # noqa: E402
from conccl.errors import CollectiveError, InvalidArgument  # noqa: E402
from conccl.testing import spawn  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _inputs(world: int, n: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(world * n, generator=g).to(dtype) for _ in range(world)]


def _rs(comm, n, dtype, op, mode, seed):
    w, r = comm.world, comm.rank
    comm.options.stream_mode = mode
    inputs = _inputs(w, n, dtype, seed)
    out = torch.full((n,), float("nan"), dtype=dtype)
    comm.call(REDUCE_SCATTER, out, inputs[r].clone(), (op,))
    expected = REDUCE_SCATTER.reference(inputs, r, [(op,)] * w)
    naive = inputs[0].view(w, -1)[r] + inputs[1].view(w, -1)[r] if w == 2 and op is None else None
    return (torch.equal(out.view(torch.uint8), expected.view(torch.uint8)),
            None if naive is None else torch.equal(out.view(torch.uint8), naive.view(torch.uint8)))


@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_equals_the_reference(world, dtype):
    for n, op, mode in ((7, None, StreamMode.PER_PEER), (1, ReduceOp.AVG, StreamMode.BATCH),
                        (1000, _make_nccl_premul_sum(0.3), StreamMode.SINGLE), (0, ReduceOp.SUM, StreamMode.PER_PEER)):
        for exact, naive in spawn(world, _rs, n, dtype, op, mode, 11 + n):
            assert exact, (world, dtype, n, op, mode)
            # two ranks: one addition, the same bits as a plain a + b (and as NCCL's)
            assert naive in (None, True), (world, dtype, n)


def _in_place_and_repeated(comm):
    w, r = comm.world, comm.rank
    results = []
    for call in range(3):  # the workspace is reused: each call must wait for the last one's readers
        inputs = _inputs(w, 5, torch.bfloat16, 100 + call)
        buf = inputs[r].clone()
        out = buf.view(w, -1)[r]  # in place: the output is the input's own chunk
        comm.call(REDUCE_SCATTER, out, buf, (ReduceOp.SUM,))
        results.append(torch.equal(out, REDUCE_SCATTER.reference(inputs, r)))
    return results


def test_in_place_and_back_to_back_calls():
    assert spawn(3, _in_place_and_repeated) == [[True] * 3] * 3


def _persistent_and_async(comm):
    w, r = comm.world, comm.rank
    inp = torch.zeros(w * 6)
    out = torch.empty(6)
    op = comm.persistent(REDUCE_SCATTER, out, inp, (ReduceOp.AVG,))
    ok = []
    for step in range(4):
        inputs = _inputs(w, 6, torch.float32, step)
        inp.copy_(inputs[r])
        work = op.start(async_op=step % 2 == 1)
        if work is not None:
            work.wait()
        ok.append(torch.equal(out, REDUCE_SCATTER.reference(inputs, r, [(ReduceOp.AVG,)] * w)))
    return ok


def test_persistent_and_async_starts():
    assert spawn(2, _persistent_and_async) == [[True] * 4] * 2


def _mismatched_op(comm):
    op = ReduceOp.SUM if comm.rank else ReduceOp.AVG
    out = torch.full((4,), 3.0)
    try:
        comm.call(REDUCE_SCATTER, out, torch.ones(comm.world * 4), (op,))
    except CollectiveError as e:
        return str(e), bool((out == 3.0).all())
    return "no error", False


def test_a_different_op_on_one_rank_is_refused_everywhere_before_anything_moves():
    for msg, untouched in spawn(3, _mismatched_op):
        assert "reduction op" in msg and "nothing was moved" in msg and untouched


def _bad_calls(comm):
    w = comm.world
    errors = []
    for out, inp, args, kw in ((torch.empty(4), torch.empty(w * 4 + 1), (None,), {}),          # sizes
                               (torch.empty(4, dtype=torch.int32), torch.empty(w * 4, dtype=torch.int32), (None,), {}),
                               (torch.empty(4), torch.empty(w * 4), (ReduceOp.MAX,), {}),      # op
                               (torch.empty(4), torch.empty(w * 4), (None,), {"algorithm": Algorithm.PULL})):
        try:
            comm.call(REDUCE_SCATTER, out, inp, args, **kw)
            errors.append("no error")
        except InvalidArgument as e:
            errors.append(type(e).__name__)
    return errors, comm.seq


def test_bad_calls_raise_before_anything_moves():
    assert spawn(2, _bad_calls) == [(["InvalidArgument"] * 4, 0)] * 2


def _factors_on_the_same_tensors(comm):
    """PREMUL_SUM(2.0), then (3.0), then (2.0) on the same tensors: each call its own factor.
    torch's ReduceOp compares PREMUL_SUM(2.0) equal to PREMUL_SUM(3.0); a call remembered by
    that key replayed the first factor."""
    w, r = comm.world, comm.rank
    inp = torch.arange(w * 4, dtype=torch.float32) + r
    out = torch.empty(4, dtype=torch.float32)
    got = []
    for f in (2.0, 3.0, 2.0):
        comm.reduce_scatter_tensor(out, inp, op=_make_nccl_premul_sum(f))
        expected = f * sum(torch.arange(w * 4, dtype=torch.float32)[r * 4:(r + 1) * 4] + k for k in range(w))
        got.append(bool(torch.equal(out, expected)))
    return got


def test_each_premul_factor_is_its_own_even_on_the_same_tensors():
    assert all(all(x) for x in spawn(2, _factors_on_the_same_tensors))
