"""GPU tier: conccl.tp under torch.compile with inductor: a sequence-parallel
MLP block (the parallel layers) compiled with ``fullgraph=True`` (a graph break fails it) runs
forward and backward and equals eager; the collectives ran as conccl's custom ops (the profiler
shows no NCCL kernel). Inputs and weights are small whole numbers, so every GEMM is exact and
"equal" means the same bits. Each test starts one process per GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _compiled_block(rank, world):
    from torch.profiler import ProfilerActivity, profile

    from conccl import tp as ctp

    d, f, seq = 256, 512, 64 * world
    kw = dict(world_size=world, device="cuda", dtype=torch.bfloat16)
    col = ctp.ColumnParallelLinear(d, (f, f), schedule="direct-p2", backward_schedule="direct", **kw)
    row = ctp.RowParallelLinear(f, d, schedule="direct", backward_schedule="direct-p2", **kw)
    g = torch.Generator(device="cuda").manual_seed(11 + rank)
    with torch.no_grad():
        for p in [*col.weights, row.weight]:
            p.copy_(torch.randint(-1, 2, p.shape, device="cuda", generator=g).to(p.dtype))
    x = torch.randint(-1, 2, (seq // world, d), device="cuda", generator=g).to(torch.bfloat16)
    params = [*col.weights, row.weight]

    def block(x):
        gate, up = col(x)
        return row(torch.relu(gate) * up)

    runs = []
    compiled = torch.compile(block, fullgraph=True)
    for fn in (block, compiled, compiled):  # the compiled block twice: compiling, then cached
        for p in params:
            p.grad = None
        y = fn(x)
        y.float().sum().backward()  # gradients of ones: every GEMM of the backward stays exact too
        torch.cuda.synchronize()
        runs.append((y.detach().clone(), [p.grad.clone() for p in params]))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        compiled(x).float().sum().backward()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    same = [torch.equal(runs[0][0], r[0]) and all(torch.equal(a, b) for a, b in zip(runs[0][1], r[1]))
            for r in runs[1:]]
    return same, [k for k in kernels if ("nccl" in k.lower() and "conccl" not in k.lower())]


def test_a_compiled_block_equals_eager_and_runs_conccls_ops():
    from conccl.launch import run_per_gpu

    for same, nccl in run_per_gpu(_compiled_block):
        assert same == [True, True], same
        assert nccl == [], nccl
