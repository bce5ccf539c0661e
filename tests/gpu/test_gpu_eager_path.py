"""GPU tier: eager calls routed by ``nccl_below`` run NCCL's kernels, the others copy engines
only; results equal NCCL's bit for bit either way.

Each test starts one process per GPU (skipping: conftest.py).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _routed_against_nccl(rank, world):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import conccl
    from conccl.planner.profile import ProfileError

    report = {}
    try:
        report["auto"] = conccl.set_eager_path("auto")["nccl_below"]
    except ProfileError as e:  # the shipped profile is an H200's
        report["auto"] = str(e)
    conccl.set_options(nccl_below={"all_gather": 1 << 20, "all_reduce": 1 << 20})
    cases = []
    for n in (1024, 1 << 19):  # 4 KiB and 2 MiB of fp32 output per rank (all-gather: world times that)
        for name in ("all_gather", "all_reduce"):
            # whole numbers: every order of summation gives NCCL's bits, at any world size
            x = torch.randint(-8, 8, (n,), device="cuda",
                              generator=torch.Generator(device="cuda").manual_seed(rank + n)).float()
            if name == "all_gather":
                out, ref = torch.empty(world * n, device="cuda"), torch.empty(world * n, device="cuda")
                dist.all_gather_into_tensor(ref, x)
                call = lambda: conccl.all_gather_into_tensor(out, x, async_op=True)  # noqa: E731
            else:
                out, ref = x.clone(), x.clone()
                dist.all_reduce(ref)
                call = lambda: conccl.all_reduce(out, async_op=True)  # noqa: E731
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                work = call()
                work.wait()
                torch.cuda.synchronize()
            kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                              and not e.name.startswith(("Memcpy", "Memset"))})
            cases.append((name, out.numel() * 4, work.path, any("nccl" in k.lower() for k in kernels), kernels,
                          torch.equal(out.view(torch.int32), ref.view(torch.int32))))
    if isinstance(report["auto"], dict):  # the shipped profile's GPU: conccl.overlap can plan here
        # a collective run beside a computation is never routed, however small
        a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        shard, gathered = torch.ones(1024, device="cuda"), torch.empty(world * 1024, device="cuda")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with conccl.overlap(plan="conccl") as c3:
                c3.matmul(a, a)
                c3.all_gather_into_tensor(gathered, shard)
            torch.cuda.synchronize()
        report["overlap_kernels"] = sorted({e.name for e in prof.events()
                                            if e.device_type == torch.autograd.DeviceType.CUDA})
        report["overlap_right"] = bool((gathered == 1).all())
    conccl.set_eager_path("copy_engines")
    out = torch.empty(world * 8, device="cuda")
    report["after_reset"] = conccl.all_gather_into_tensor(out, torch.ones(8, device="cuda"), async_op=True).path
    report["cases"] = cases
    return report


def test_small_eager_calls_run_nccl_and_large_ones_copy_engines():
    from conccl.launch import run_per_gpu

    for r in run_per_gpu(_routed_against_nccl):
        print(r)
        assert isinstance(r["auto"], str) or set(r["auto"]) >= {"all_gather", "all_to_all"}, r["auto"]
        for name, nbytes, path, nccl_ran, kernels, right in r["cases"]:
            assert right, (name, nbytes)
            routed = nbytes < (1 << 20)
            assert path == ("nccl" if routed else "copy_engines"), (name, nbytes, path)
            assert nccl_ran == routed, (name, nbytes, kernels)
            if not routed:  # copy engines, and at most the all-reduce's reduction kernel
                assert all(k.startswith("reduce_") for k in kernels), kernels
        assert r["after_reset"] == "copy_engines"
        if "overlap_kernels" in r:
            assert r["overlap_right"] and not any("nccl" in k.lower() for k in r["overlap_kernels"]), r
