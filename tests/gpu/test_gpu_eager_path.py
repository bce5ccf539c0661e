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
    report = {}
    chosen = conccl.set_eager_path("auto")  # no study first: any GPU gets a profile
    report["auto"], report["profile"] = chosen["nccl_below"], chosen["profile"]
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
            cases.append((name, out.numel() * 4, work.path, any(("nccl" in k.lower() and "conccl" not in k.lower()) for k in kernels), kernels,
                          torch.equal(out.view(torch.int32), ref.view(torch.int32))))
    for plan in ("conccl", "auto"):  # a collective run beside a computation is never routed, however small
        a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        shard, gathered = torch.ones(1024, device="cuda"), torch.empty(world * 1024, device="cuda")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            with conccl.overlap(plan=plan) as c3:
                c3.matmul(a, a)
                c3.all_gather_into_tensor(gathered, shard)
            torch.cuda.synchronize()
        report[f"overlap_{plan}"] = (c3.plan.impl, bool((gathered == 1).all()),
                                     sorted({e.name for e in prof.events()
                                             if e.device_type == torch.autograd.DeviceType.CUDA}))
    report["ordered"] = _routed_then_other_stream(rank, world)
    conccl.set_eager_path("copy_engines")
    out = torch.empty(world * 8, device="cuda")
    report["after_reset"] = conccl.all_gather_into_tensor(out, torch.ones(8, device="cuda"), async_op=True).path
    report["cases"] = cases
    return report


def _routed_then_other_stream(rank, world):
    """A blocking call routed to NCCL on stream A, queued behind a GPU sleep, then a call of
    ours on stream B that reads its output: the group orders the second after the first
    (run_fallback records the routed call's end; B's call waits for it). Returns, per try,
    whether B's output held the routed call's result."""
    import conccl
    # the first call's output (world x 4 KiB) below the limit, the second's (world x that) above
    conccl.set_options(nccl_below={"all_gather": world * 4096 + 1})
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    shard = torch.full((1024,), float(rank + 1), device="cuda")
    right = []
    for _ in range(3):
        gathered = torch.zeros(world * 1024, device="cuda")
        again = torch.zeros(world * world * 1024, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(a):
            torch.cuda._sleep(50_000_000)  # ~25 ms: the routed call lands long after B could start
            assert conccl.all_gather_into_tensor(gathered, shard).path == "nccl"  # routed (small)
        with torch.cuda.stream(b):  # copy engines, reading what the routed call wrote
            assert conccl.all_gather_into_tensor(again, gathered, async_op=False).path == "copy_engines"
        torch.cuda.synchronize()
        expect = torch.arange(1, world + 1, device="cuda").float().repeat_interleave(1024).repeat(world)
        right.append(bool(torch.equal(again, expect)))
    conccl.set_options(nccl_below={})
    return right


def test_small_eager_calls_run_nccl_and_large_ones_copy_engines():
    from conccl.launch import run_per_gpu

    for r in run_per_gpu(_routed_against_nccl):
        print(r)
        assert set(r["auto"]) >= {"all_gather", "all_to_all"}, r["auto"]
        assert r["profile"]["chosen"] in ("shipped", "fallback"), r["profile"]
        if torch.cuda.get_device_name(0) in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
            assert r["profile"]["chosen"] == "shipped", r["profile"]  # their own shipped profiles
        for name, nbytes, path, nccl_ran, kernels, right in r["cases"]:
            assert right, (name, nbytes)
            routed = nbytes < (1 << 20)
            assert path == ("nccl" if routed else "copy_engines"), (name, nbytes, path)
            assert nccl_ran == routed, (name, nbytes, kernels)
            if not routed:  # copy engines, and at most the all-reduce's reduction kernel
                assert all(k.startswith("reduce_") for k in kernels), kernels
        assert r["after_reset"] == "copy_engines"
        assert r["ordered"] == [True] * 3, r["ordered"]
        impl, right, kernels = r["overlap_conccl"]
        assert impl == "conccl" and right and not any(("nccl" in k.lower() and "conccl" not in k.lower()) for k in kernels), r
        impl, right, kernels = r["overlap_auto"]  # auto may plan NCCL beside the GEMM, never the eager route
        assert right and (impl == "nccl") == any(("nccl" in k.lower() and "conccl" not in k.lower()) for k in kernels), r
