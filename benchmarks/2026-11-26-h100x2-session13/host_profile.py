"""Where an eager call's host time goes (issue 38 item 4): per settled call, host microseconds
of conccl's all-gather (plain and conccl.empty tensors), NCCL's, and conccl.tp's two ops at
decode size, then a cProfile of each conccl case on rank 0 (top functions by own time).

    OUT=... PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session13/host_profile.py
"""
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch
import torch.distributed as dist

CALLS = 2000


def _rank(rank, world, out_dir):
    import conccl
    ctp = conccl.tp
    torch.manual_seed(rank)
    n = 32 * 1024  # 64 KiB of bf16 per rank's output chunk... output 64K*world
    plain_in = torch.randn(n // world, dtype=torch.bfloat16, device="cuda")
    plain_out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    e_out = conccl.empty(n, dtype=torch.bfloat16, device="cuda")
    e_in = conccl.empty(n // world, dtype=torch.bfloat16, device="cuda")
    e_in.copy_(plain_in)
    a_ag = torch.randn(1024 // world, 8192, dtype=torch.bfloat16, device="cuda") / 8
    w_ag = torch.randn(8192, 7168, dtype=torch.bfloat16, device="cuda") / 8
    a_rs = torch.randn(1024, 3584, dtype=torch.bfloat16, device="cuda") / 8
    w_rs = torch.randn(3584, 8192, dtype=torch.bfloat16, device="cuda") / 8
    cases = {
        "nccl all_gather 64K": lambda: dist.all_gather_into_tensor(plain_out, plain_in),
        "conccl all_gather 64K plain": lambda: conccl.all_gather_into_tensor(plain_out, plain_in),
        "conccl all_gather 64K empty": lambda: conccl.all_gather_into_tensor(e_out, e_in),
        "conccl all_gather 64K empty in place": lambda: conccl.all_gather_into_tensor(e_out, e_out[rank * (n // world):(rank + 1) * (n // world)]),
        "conccl reduce_scatter 64K plain": lambda: conccl.reduce_scatter_tensor(plain_in, plain_out),
        "tp ag_gemm 1024x8192x7168 auto": lambda: ctp.all_gather_matmul(a_ag, w_ag, schedule="auto"),
        "tp gemm_rs 1024x3584x8192 direct": lambda: ctp.matmul_reduce_scatter(a_rs, w_rs, schedule="direct"),
    }
    if os.environ.get("HOST_PROFILE_AB"):  # the TP calls with the executor's GEMM steps run as before
        from conccl.executors.cuda_ce import CudaCopyEngineExecutor

        def _on_context(self, stream, compute):  # session 12's: torch.cuda.stream() per step
            def run(op):
                with torch.cuda.stream(stream):
                    compute(op)
            return run

        new_on = CudaCopyEngineExecutor._on

        def with_on(on, fn):
            def call():
                CudaCopyEngineExecutor._on = on
                try:
                    return fn()
                finally:
                    CudaCopyEngineExecutor._on = new_on
            return call

        for name in [n for n in cases if n.startswith("tp")]:
            cases[name + " (stream context)"] = with_on(_on_context, cases[name])
            cases[name] = with_on(new_on, cases[name])
    res = {}
    for name, fn in cases.items():
        calls = CALLS if not name.startswith("tp") else 300
        for _ in range(30):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        host = []
        for rep in range(3):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            host.append((time.perf_counter() - t) / calls * 1e6)
            torch.cuda.synchronize()
            dist.barrier()
        prof_text = ""
        if not name.startswith("nccl"):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(calls):
                fn()
            pr.disable()
            torch.cuda.synchronize()
            dist.barrier()
            if rank == 0:
                f = io.StringIO()
                st = pstats.Stats(pr, stream=f)
                st.sort_stats("tottime").print_stats(30)
                st.sort_stats("cumtime").print_stats(45)
                prof_text = f.getvalue()
        res[name] = {"host_us": [round(h, 1) for h in host], "profile": prof_text}
        if rank == 0:
            print(f"{name}: host us/call {res[name]['host_us']}", flush=True)
    g = conccl.api.get_group(None)
    res["graph_launches"] = getattr(g.executor, "graph_launches", None)
    return res


def main():
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    from conccl.launch import run_per_gpu
    out_dir = os.environ.get("OUT", ".")
    results = run_per_gpu(_rank, out_dir)
    for r, res in enumerate(results):
        with open(os.path.join(out_dir, f"host_profile_r{r}.json"), "w") as f:
            json.dump(res, f, indent=1)
    for name, rec in results[0].items():
        if isinstance(rec, dict) and rec.get("profile"):
            with open(os.path.join(out_dir, "host_profile_" + name.replace(" ", "_") + ".txt"), "w") as f:
                f.write(rec["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
