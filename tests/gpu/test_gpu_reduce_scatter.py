"""GPU tier: the copy-engine reduce-scatter against NCCL's, and proof of what ran.

Each test starts one process per GPU (skipping: conftest.py).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _kernels(prof) -> list[str]:
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _reduce_scatter_against_nccl(rank, world):
    import torch.distributed as dist
    from torch.distributed import ReduceOp
    from torch.profiler import ProfilerActivity, profile

    import conccl

    report = {"cases": [], "kernels": None}
    g = torch.Generator(device="cuda").manual_seed(5 + rank)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for n in (1, 1000, 12345, (64 << 20) // 2 + 3):
            for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PREMUL_SUM(0.37)):
                inp = torch.randn(world * n, dtype=torch.float32, device="cuda", generator=g).to(dtype)
                out = torch.full((n,), float("nan"), dtype=dtype, device="cuda")
                ref = torch.empty_like(out)
                conccl.reduce_scatter_tensor(out, inp, op=op)
                dist.reduce_scatter_tensor(ref, inp, op=op)
                torch.cuda.synchronize()
                same = torch.equal(out.view(torch.uint8) if dtype != torch.float32 else out.view(torch.int32),
                                   ref.view(torch.uint8) if dtype != torch.float32 else ref.view(torch.int32))
                close = bool(torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2))
                report["cases"].append((str(dtype), n, str(getattr(op, "op", op)), same, close))
    # in place, and a persistent op started many times
    n = 4099
    buf = torch.randn(world * n, device="cuda", generator=g).to(torch.bfloat16)
    expect = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dist.reduce_scatter_tensor(expect, buf.clone())
    conccl.reduce_scatter_tensor(buf[rank * n:(rank + 1) * n], buf)
    torch.cuda.synchronize()
    report["in_place"] = torch.equal(buf[rank * n:(rank + 1) * n], expect)
    inp = torch.empty(world * n, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    op = conccl.get_group().persistent(conccl.collectives.reduce_scatter.REDUCE_SCATTER, out, inp, (ReduceOp.SUM,))
    ok = []
    for step in range(5):
        inp.copy_(torch.randn(world * n, device="cuda", generator=g).to(torch.bfloat16))
        op.start()
        dist.reduce_scatter_tensor(expect, inp, op=ReduceOp.SUM)
        torch.cuda.synchronize()
        ok.append(torch.equal(out, expect))
    report["persistent"] = ok
    # what runs: the reduction kernel and nothing else (no NCCL, no elementwise torch kernel)
    inp = torch.randn(world * (8 << 20), device="cuda", generator=g).to(torch.bfloat16)
    out = torch.empty(8 << 20, dtype=torch.bfloat16, device="cuda")
    conccl.reduce_scatter_tensor(out, inp)
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            conccl.reduce_scatter_tensor(out, inp)
        torch.cuda.synchronize()
    report["kernels"] = sorted(set(_kernels(prof)))
    report["kernel_count"] = sum(1 for k in _kernels(prof) if "reduce" in k)
    return report


def test_reduce_scatter_equals_nccl_and_runs_only_the_reduction_kernel():
    from conccl.launch import run_per_gpu

    results = run_per_gpu(_reduce_scatter_against_nccl)
    world = len(results)
    for dtype, n, op, same, close in results[0]["cases"]:  # the table, for the log (pytest -s)
        print(f"reduce_scatter world {world} {dtype} n={n} {op}: bits equal to NCCL {same}, close {close}")
    for r in results:
        for dtype, n, op, same, close in r["cases"]:
            # two ranks: one addition (after the same scaling), so NCCL's bits; more: its rounding
            assert same if world == 2 and "SUM" in op and "PREMUL" not in op else close, (dtype, n, op, same, r)
        assert r["in_place"] and r["persistent"] == [True] * 5, r
        assert all(k.startswith("reduce_") or "Memcpy" in k or "Memset" in k for k in r["kernels"]), r["kernels"]
        assert r["kernel_count"] == 3, r
