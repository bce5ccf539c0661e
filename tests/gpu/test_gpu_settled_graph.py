"""GPU tier: settled eager calls launched as graphs (conccl.executors.cuda.graph_launch).

Every collective called ten times on the same tensors (new values each time): on conccl.empty
tensors from the third call on its program runs as one graph launch, on plain tensors it keeps
its driver calls; every result equals NCCL's bit for bit; no launch runs a kernel but the
sums' (no copy turned into an SM kernel); and with one rank on graphs and the other on driver
calls (the routes interoperate: same operations, same values) results are still NCCL's. One process per GPU (skipping: conftest.py).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

CALLS = 10


def _settled(rank, world):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import conccl

    conccl.set_eager_path("copy_engines")
    g = conccl.get_group()
    ex = g.executor
    mixed = rank == 1  # in the mixed round this rank's calls stay driver calls; rank 0's become graphs
    out = {"cases": [], "mixed_rank": mixed}
    gen = torch.Generator(device="cuda").manual_seed(rank)

    def ints(n):  # whole numbers: any order of summation gives NCCL's bits
        return torch.randint(-8, 8, (n,), device="cuda", generator=gen).to(torch.bfloat16)

    n = 16384  # 32 KiB of bf16 per rank
    for round_ in ("plain", "symmetric", "mixed"):
        if round_ == "mixed" and mixed:
            ex._settled_graph = lambda *a, **k: False
        before = (ex.programs_graphed, ex.graph_launches)

        def alloc(k, sym=round_ != "plain"):
            return conccl.empty(k, dtype=torch.bfloat16) if sym else torch.empty(k, dtype=torch.bfloat16, device="cuda")

        ag_in, ag_out = alloc(n), alloc(world * n)
        rs_in, rs_out = alloc(world * n), alloc(n)
        a2a_in, a2a_out = alloc(world * n), alloc(world * n)
        ar = alloc(n)
        wrong = 0
        for i in range(CALLS):
            ag_in.copy_(ints(n))
            rs_in.copy_(ints(world * n))
            a2a_in.copy_(ints(world * n))
            ar_in = ints(n)
            ar.copy_(ar_in)
            conccl.all_gather_into_tensor(ag_out, ag_in)
            conccl.reduce_scatter_tensor(rs_out, rs_in)
            conccl.all_to_all_single(a2a_out, a2a_in)
            conccl.all_reduce(ar)
            ref = torch.empty_like(ag_out)
            dist.all_gather_into_tensor(ref, ag_in.clone())
            wrong += int(not torch.equal(ag_out, ref))
            ref = torch.empty_like(rs_out)
            dist.reduce_scatter_tensor(ref, rs_in.clone())
            wrong += int(not torch.equal(rs_out, ref))
            ref = torch.empty_like(a2a_out)
            dist.all_to_all_single(ref, a2a_in.clone())
            wrong += int(not torch.equal(a2a_out, ref))
            dist.all_reduce(ar_in)
            wrong += int(not torch.equal(ar, ar_in))
        torch.cuda.synchronize()
        launches = ex.graph_launches - before[1]
        kernels = {}
        for name, call in (("all_gather", lambda: conccl.all_gather_into_tensor(ag_out, ag_in)),
                           ("reduce_scatter", lambda: conccl.reduce_scatter_tensor(rs_out, rs_in)),
                           ("all_to_all", lambda: conccl.all_to_all_single(a2a_out, a2a_in)),
                           ("all_reduce", lambda: conccl.all_reduce(ar))):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            kernels[name] = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                                    and not e.name.startswith(("Memcpy", "Memset"))})
        out["cases"].append({"round": round_, "wrong": wrong, "graphed": ex.programs_graphed - before[0],
                             "launches": launches, "kernels": kernels, "failures": ex.graph_failures})
    return out


def test_settled_calls_run_as_graphs_with_nccls_bits():
    from conccl.launch import run_per_gpu

    for r in run_per_gpu(_settled):
        print(r)
        for case in r["cases"]:
            assert case["wrong"] == 0, case
            assert case["failures"] == 0, case
            if case["round"] == "plain" or (case["round"] == "mixed" and r["mixed_rank"]):
                assert case["launches"] == 0 and case["graphed"] == 0, case  # driver calls stay
                continue
            # the all-gather, reduce-scatter and all-to-all at least, each from its third call (a
            # double-buffered call alternates two programs: 6 of its 10 calls)
            assert case["graphed"] >= 3 and case["launches"] >= 3 * 6, case
        for case in r["cases"]:  # copy engines and memory operations only, but the sums' kernel
            k = case["kernels"]
            assert k["all_gather"] == [] and k["all_to_all"] == [], case
            assert all(name.startswith("reduce_") for name in k["reduce_scatter"] + k["all_reduce"]), case
