"""CPU multi-process tier: conccl.tp under torch.compile. The custom ops
(torch.ops.conccl.all_gather_matmul / matmul_reduce_scatter) pass PyTorch's schema and fake-
tensor checks, and a function and a sharded MLP block (the parallel layers, forward and backward)
compile with ``fullgraph=True`` (a graph break fails it) and give eager's bits. Over the
reference executor; the ``aot_eager`` backend (AOT autograd's tracing, no code generation:
what inductor receives, without a compiler on the CI machine). Inputs are small whole numbers:
every GEMM exact."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl import tp as ctp  # noqa: E402
from conccl.testing import spawn  # noqa: E402


def _ints(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(torch.float32)


def _compiled_ops(comm):
    torch.set_num_threads(1)
    name = ctp.op_group(comm)
    w, r = comm.world, comm.rank
    x = _ints((4, 8), 10 + r)
    w1, w2 = _ints((8, 6), 1), _ints((6, 8), 2)
    torch.library.opcheck(torch.ops.conccl.all_gather_matmul.default, (x, [w1], 0, name, "direct", True),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.conccl.matmul_reduce_scatter.default, (_ints((2 * w, 6), 3), w2, 0, name,
                                                                          "serial", "sum"),
                          test_utils=("test_schema", "test_faketensor"))

    def f(x):
        gathered, y = torch.ops.conccl.all_gather_matmul(x * 2, [w1], 0, name, "direct-p2", True)
        z = torch.ops.conccl.matmul_reduce_scatter(torch.relu(y), w2, 0, name, "direct", "sum")
        return gathered.sum() + z - 1

    eager = f(x)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    return torch.equal(eager, compiled), tuple(compiled.shape)


def _compiled_block(comm):
    torch.set_num_threads(1)
    w, r = comm.world, comm.rank
    d, f, seq = 8, 16, 2 * w
    col = ctp.ColumnParallelLinear(d, (f, f), comm, world_size=w, schedule="direct", backward_schedule="ring")
    row = ctp.RowParallelLinear(f, d, comm, world_size=w, schedule="serial", backward_schedule="direct-p2")
    with torch.no_grad():
        for i, p in enumerate([*col.weights, row.weight]):
            p.copy_(_ints(p.shape, 50 + 10 * i + r))
    x = _ints((seq // w, d), 70 + r)

    def block(x):
        g_, u_ = col(x)
        return (row(torch.relu(g_) * u_) ** 2).sum()

    params = [*col.weights, row.weight]
    results = []
    for fn in (block, torch.compile(block, backend="aot_eager", fullgraph=True)):
        for p in params:
            p.grad = None
        loss = fn(x)
        loss.backward()
        results.append((loss.detach().clone(), [p.grad.clone() for p in params]))
    (le, ge), (lc, gc) = results
    return torch.equal(le, lc) and all(torch.equal(a, b) for a, b in zip(ge, gc)), float(le)


@pytest.mark.parametrize("world", [2, 3])
def test_the_ops_pass_the_checks_and_compile_to_eager_bits(world):
    for same, shape in spawn(world, _compiled_ops, join_timeout_s=240):
        assert same
        assert shape == (4, 8)  # the reduce-scatter's rows: world * 4 gathered, / world


def test_a_sharded_block_compiles_without_a_graph_break_forward_and_backward():
    out = spawn(2, _compiled_block, join_timeout_s=240)
    for same, loss in out:
        assert same and loss > 0


def _drop_in(comm):
    torch.set_num_threads(1)
    name = ctp.op_group(comm)
    r = comm.rank
    a, b = _ints((4, 8), 20 + r), _ints((8, 6), 5)
    A, (y,) = ctp.fused_all_gather_matmul(a, [b], 0, name)
    A2, (y2,) = ctp.all_gather_matmul(a, [b], 0, comm, return_gathered=True)
    none, _ = ctp.fused_all_gather_matmul(a, [b], 0, name, return_A=False)
    z = ctp.fused_matmul_reduce_scatter(_ints((4, 8), 30 + r), b, "avg", 0, name)
    z2 = ctp.matmul_reduce_scatter(_ints((4, 8), 30 + r), b, 0, torch.distributed.ReduceOp.AVG, comm)
    return torch.equal(A, A2) and torch.equal(y, y2) and none is None and torch.equal(z, z2)


def test_the_async_tp_signatures_give_the_same_results():
    assert all(spawn(2, _drop_in, join_timeout_s=120))
