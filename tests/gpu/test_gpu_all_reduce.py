"""GPU tier: the copy-engine all-reduce against NCCL's, and proof of what ran.

Each test starts one process per GPU (skipping: conftest.py).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _kernels(prof) -> list[str]:
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _all_reduce_against_nccl(rank, world):
    import torch.distributed as dist
    from torch.distributed import ReduceOp
    from torch.profiler import ProfilerActivity, profile

    import conccl
    from conccl.collectives.all_reduce import ALL_REDUCE

    report = {"cases": []}
    g = torch.Generator(device="cuda").manual_seed(17 + rank)
    group = conccl.get_group()
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for n in (1, 1000, 12345, (64 << 20) // 2 + 3):
            for op in (ReduceOp.SUM, ReduceOp.AVG):
                for mode, algorithm, in_place in (
                        (conccl.StreamMode.BATCH, None, True), (conccl.StreamMode.PER_PEER, None, False),
                        (conccl.StreamMode.BATCH, conccl.Algorithm.PUSH, True),
                        (conccl.StreamMode.PER_PEER, conccl.Algorithm.STAGED_PUSH, False),
                        # one pass in place: its pushes and its reduction on one stream whatever the mode
                        (conccl.StreamMode.PER_PEER, conccl.Algorithm.STAGED_PUSH, True)):
                    x = torch.randn(n, dtype=torch.float32, device="cuda", generator=g).to(dtype)
                    ref = x.clone()
                    dist.all_reduce(ref, op=op)
                    every = torch.empty(world * n, dtype=dtype, device="cuda")
                    dist.all_gather_into_tensor(every, x)
                    stated = ALL_REDUCE.reference(list(every.view(world, -1)), rank, [(op,)] * world)
                    if mode is conccl.StreamMode.BATCH and algorithm is None:
                        conccl.all_reduce(x, op=op)  # the public, in-place call (one pass or two by size)
                        out = x
                    elif in_place:  # a form asked for, in place
                        group.all_reduce(x, x, op, stream_mode=mode, algorithm=algorithm)
                        out = x
                    else:  # the group's out-of-place call, one stream per peer (one pass asked, or by size)
                        out = torch.full_like(x, float("nan"))
                        group.all_reduce(out, x, op, stream_mode=mode, algorithm=algorithm)
                    torch.cuda.synchronize()
                    bits = lambda t: t.view(torch.int32 if dtype == torch.float32 else torch.int16)  # noqa: E731
                    # NCCL rounds after each of its world - 1 additions (its order is its own), conccl
                    # once: each rounding moves a partial sum by at most half an ulp, so the two differ
                    # by at most world ulps of the sum of magnitudes (elementwise).
                    bound = world * torch.finfo(dtype).eps * every.view(world, -1).float().abs().sum(0)
                    how = f"{mode.value}/{algorithm.value if algorithm else 'auto'}{'/in place' if in_place else ''}"
                    report["cases"].append((str(dtype), n, str(op), how, torch.equal(bits(out), bits(ref)),
                                            bool(((out.float() - ref.float()).abs() <= bound).all()),
                                            torch.equal(bits(out), bits(stated))))
    # mixed with the other collectives on one group, and a persistent op started many times
    n = 4099
    buf = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    expect = torch.empty_like(buf)
    op = conccl.persistent_all_reduce(buf)
    ok = []
    for step in range(5):
        # whole numbers: every partial sum exact in bf16, so NCCL's bits at any world size
        buf.copy_(torch.randint(-3, 4, (n,), device="cuda", generator=g).to(torch.bfloat16))
        expect.copy_(buf)
        dist.all_reduce(expect)
        op.start()
        gathered = torch.empty(world * 64, device="cuda")
        conccl.all_gather_into_tensor(gathered, torch.full((64,), float(rank + step), device="cuda"))
        torch.cuda.synchronize()
        ok.append(torch.equal(buf, expect)
                  and torch.equal(gathered, (torch.arange(world, device="cuda") + step).repeat_interleave(64).float()))
    report["persistent_mixed"] = ok
    # what runs: the reduction kernel and nothing else (no NCCL, no elementwise torch kernel)
    x = torch.randn(16 << 20, device="cuda", generator=g).to(torch.bfloat16)
    conccl.all_reduce(x, op=ReduceOp.AVG)
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            conccl.all_reduce(x, op=ReduceOp.AVG)
        torch.cuda.synchronize()
    report["kernels"] = sorted(set(_kernels(prof)))
    report["kernel_count"] = sum(1 for k in _kernels(prof) if "reduce" in k)
    # the same, small enough to run in one pass (which the spy sees): the reduction kernel only
    from conccl.collectives.all_reduce import one_pass
    small = torch.randn(1 << 19, device="cuda", generator=g).to(torch.bfloat16)
    ran, run = [], group.executor.run
    group.executor.run = lambda schedule, *a, **k: (ran.append(schedule.algorithm.value), run(schedule, *a, **k))[1]
    conccl.all_reduce(small)
    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            conccl.all_reduce(small)
        torch.cuda.synchronize()
    group.executor.run = run
    report["one_pass"] = (one_pass(small.numel() * 2, world), ran)
    report["kernels_1p"] = sorted(set(_kernels(prof)))
    report["kernel_count_1p"] = sum(1 for k in _kernels(prof) if "reduce" in k)
    return report


def test_all_reduce_equals_nccl_and_runs_only_the_reduction_kernel():
    from conccl.launch import run_per_gpu

    results = run_per_gpu(_all_reduce_against_nccl)
    world = len(results)
    for dtype, n, op, mode, same, close, stated in results[0]["cases"]:  # the table, for the log (pytest -s)
        print(f"all_reduce world {world} {dtype} n={n} {op} {mode}: bits equal to NCCL {same}, close {close}, "
              f"bits equal to the stated arithmetic {stated}")
    for r in results:
        for dtype, n, op, mode, same, close, stated in r["cases"]:
            assert stated, (dtype, n, op, mode)  # every case: exactly the documented order and rounding
            if world == 2 and op.endswith("SUM"):
                assert same, (dtype, n, op, mode)  # one addition: NCCL's bits
            else:
                assert close, (dtype, n, op, mode)
        assert r["persistent_mixed"] == [True] * 5, r["persistent_mixed"]
        assert all(k.startswith("reduce_") or "Memcpy" in k or "Memset" in k for k in r["kernels"]), r["kernels"]
        assert r["kernel_count"] == 3, r
        expect = "staged_push" if r["one_pass"][0] else "push"
        assert r["one_pass"][1] == [expect] * 4, r["one_pass"]  # the call the test meant ran
        assert all(k.startswith("reduce_") or "Memcpy" in k or "Memset" in k for k in r["kernels_1p"]), r["kernels_1p"]
        assert r["kernel_count_1p"] == 3, r
