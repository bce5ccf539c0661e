"""GPU tier: one-shot calls (conccl.collectives.one_shot: a small call as one kernel of one CTA)
against NCCL, eager and captured, mixed with copy-engine calls; the profiler shows the kernel
ran and nothing else moved the bytes. Each test starts one process per GPU (conftest.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _one_shot_against_nccl(rank, world):
    import os

    os.environ["CONCCL_ONE_SHOT_BELOW"] = "256K"  # read when the group is made
    import torch.distributed as dist
    from torch.distributed import ReduceOp
    from torch.profiler import ProfilerActivity, profile

    import conccl

    g = torch.Generator(device="cuda").manual_seed(11 + rank)
    n = 4099  # odd: the kernel's scalar tails
    ag_in, ag_out = torch.empty(n, device="cuda"), torch.empty(world * n, device="cuda")
    a2a_in, a2a_out = torch.empty(world * 1024, device="cuda"), torch.empty(world * 1024, device="cuda")
    rs_in = torch.empty(world * n, dtype=torch.bfloat16, device="cuda")
    rs_out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    ar = torch.empty(12288, dtype=torch.bfloat16, device="cuda")
    big_in, big_out = torch.empty(1 << 20, device="cuda"), torch.empty(world << 20, device="cuda")  # copy engines

    def calls():  # the paths each call's Work says it took
        return [conccl.all_gather_into_tensor(ag_out, ag_in).path,
                conccl.all_to_all_single(a2a_out, a2a_in).path,
                conccl.all_gather_into_tensor(big_out, big_in).path,
                conccl.reduce_scatter_tensor(rs_out, rs_in).path,
                conccl.all_reduce(ar, op=ReduceOp.SUM).path]

    def fill():
        for t in (ag_in, a2a_in, rs_in, ar, big_in):
            t.copy_(torch.randn(t.shape, device="cuda", generator=g).to(t.dtype))

    def expected():
        e = {"ag": torch.empty_like(ag_out), "a2a": torch.empty_like(a2a_out), "rs": torch.empty_like(rs_out),
             "ar": ar.clone(), "big": torch.empty_like(big_out)}
        dist.all_gather_into_tensor(e["ag"], ag_in)
        dist.all_to_all_single(e["a2a"], a2a_in)
        dist.all_gather_into_tensor(e["big"], big_in)
        dist.reduce_scatter_tensor(e["rs"], rs_in)
        dist.all_reduce(e["ar"])
        return e

    def same(e):
        torch.cuda.synchronize()
        eq = lambda a, b: torch.equal(a.view(torch.uint8), b.view(torch.uint8))  # noqa: E731
        return (eq(ag_out, e["ag"]), eq(a2a_out, e["a2a"]), eq(big_out, e["big"]), eq(rs_out, e["rs"]) or world > 2,
                eq(ar, e["ar"]) or world > 2)

    ok, paths = [], {}
    for _ in range(5):  # eager, both workspace halves
        fill()
        e = expected()
        paths["eager"] = calls()
        ok.append(same(e))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        conccl.all_gather_into_tensor(ag_out, ag_in)
        conccl.all_reduce(ar)
        torch.cuda.synchronize()
    eager_kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    conccl.reserve_graph_workspace(64 << 20)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paths["captured"] = calls()
    for _ in range(4):
        fill()
        e = expected()
        graph.replay()
        ok.append(same(e))
    return {"ok": ok, "eager_kernels": eager_kernels, "paths": paths}


def test_one_shot_calls_equal_nccl_eager_and_captured():
    from conccl.launch import run_per_gpu

    for r in run_per_gpu(_one_shot_against_nccl):
        print(r)
        assert all(all(step) for step in r["ok"]), r["ok"]
        want = ["one_shot", "one_shot", "copy_engines", "one_shot", "one_shot"]  # the 4 MiB gather: copy engines
        assert r["paths"] == {"eager": want, "captured": want}, r["paths"]
        # the two calls: one kernel each, no copy, no NCCL kernel
        assert r["eager_kernels"].count("conccl_one_shot") == 2, r["eager_kernels"]
        assert not any(("nccl" in k.lower() and "conccl" not in k.lower()) or "memcpy" in k.lower() for k in r["eager_kernels"]), r["eager_kernels"]


def _back_to_back(rank, world):
    """One-shot and copy-engine calls queued back to back with nothing between them, so a rank
    can run calls ahead of its peers and both workspace halves are in flight: the expected
    values come from NCCL first, every conccl call's tensors are its own, one sync at the end."""
    import os

    os.environ["CONCCL_ONE_SHOT_BELOW"] = "256K"
    import torch.distributed as dist

    import conccl

    g = torch.Generator(device="cuda").manual_seed(23 + rank)
    calls = []
    for i in range(24):
        n = (1000, 1 << 18)[i % 3 == 2]  # every third call on the copy engines (1 MiB per rank: above the limit)
        if i % 2:
            x = torch.randn(world * n, device="cuda", generator=g).to(torch.bfloat16)
            want = torch.empty(n, dtype=torch.bfloat16, device="cuda")
            dist.reduce_scatter_tensor(want, x)
            calls.append(("rs", x, torch.empty_like(want), want))
        else:
            x = torch.randn(n, device="cuda", generator=g)
            want = torch.empty(world * n, device="cuda")
            dist.all_gather_into_tensor(want, x)
            calls.append(("ag", x, torch.empty_like(want), want))
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        torch.cuda._sleep(50_000_000)  # rank 0's stream starts late: its peers run ahead
    for kind, x, out, _ in calls:
        if kind == "rs":
            conccl.reduce_scatter_tensor(out, x)
        else:
            conccl.all_gather_into_tensor(out, x)
    torch.cuda.synchronize()
    return [torch.equal(out.view(torch.uint8), want.view(torch.uint8)) or (kind == "rs" and world > 2)
            for kind, _, out, want in calls]


def test_back_to_back_calls_with_a_late_rank_equal_nccl():
    from conccl.launch import run_per_gpu

    for ok in run_per_gpu(_back_to_back):
        assert all(ok), ok
