"""Host time of an eager conccl.tp call, settled pipelines launched as one graph against driver
calls (issue 38 item 4): per call, host microseconds of the queueing loop and the whole loop's
wall time to the GPU's end, graphs on and off in turns in one process (off: the executor's
``_settled_pipeline`` answers False, so every call stays driver calls), both ranks; then a
cProfile of each case on rank 0.

    OUT=... PYTHONPATH=src python3 benchmarks/2026-11-27-h100x2-session14/host_tp.py
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

CALLS = 300


def _rank(rank, world, out_dir):
    import conccl
    ctp = conccl.tp
    from conccl.api import get_group
    torch.manual_seed(rank)
    ex = get_group(None).executor
    a_ag = torch.randn(1024 // world, 8192, dtype=torch.bfloat16, device="cuda") / 8
    w_ag = torch.randn(8192, 7168, dtype=torch.bfloat16, device="cuda") / 8
    a_rs = torch.randn(1024, 3584, dtype=torch.bfloat16, device="cuda") / 8
    w_rs = torch.randn(3584, 8192, dtype=torch.bfloat16, device="cuda") / 8
    cases = {
        "ag_gemm 1024x8192x7168 auto": lambda: ctp.all_gather_matmul(a_ag, w_ag, schedule="auto"),
        "ag_gemm 1024x8192x7168 direct": lambda: ctp.all_gather_matmul(a_ag, w_ag, schedule="direct"),
        "gemm_rs 1024x3584x8192 direct": lambda: ctp.matmul_reduce_scatter(a_rs, w_rs, schedule="direct"),
        "gemm_rs 1024x3584x8192 direct-p2-s2": lambda: ctp.matmul_reduce_scatter(a_rs, w_rs, schedule="direct-p2-s2"),
    }
    off = lambda *a, **k: False  # noqa: E731

    def graphs(on: bool):
        if on:
            ex.__dict__.pop("_settled_pipeline", None)
        else:
            ex._settled_pipeline = off

    res = {}
    for name, fn in cases.items():
        rec = {}
        for turn in range(3):
            for mode in ("graphs", "driver calls"):
                graphs(mode == "graphs")
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
                dist.barrier()
                launches = ex.graph_launches
                t = time.perf_counter()
                for _ in range(CALLS):
                    fn()
                host = (time.perf_counter() - t) / CALLS * 1e6
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t) / CALLS * 1e6
                dist.barrier()
                rec.setdefault(mode, []).append({"host_us": round(host, 1), "wall_us": round(wall, 1),
                                                 "graph_launches": ex.graph_launches - launches})
        for mode in ("graphs", "driver calls"):
            graphs(mode == "graphs")
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(CALLS):
                fn()
            pr.disable()
            torch.cuda.synchronize()
            dist.barrier()
            if rank == 0:
                f = io.StringIO()
                st = pstats.Stats(pr, stream=f)
                st.sort_stats("tottime").print_stats(25)
                st.sort_stats("cumtime").print_stats(35)
                rec[f"profile {mode}"] = f.getvalue()
        graphs(True)
        res[name] = rec
        if rank == 0:
            print(name, {m: [(r["host_us"], r["wall_us"], r["graph_launches"]) for r in rec[m]]
                         for m in ("graphs", "driver calls")}, flush=True)
    res["counters"] = {k: getattr(ex, k) for k in ("programs_graphed", "pipelines_graphed", "graph_launches",
                                                    "graph_failures", "programs_compiled")}
    if rank == 0:
        print("counters", res["counters"], flush=True)
    return res


def main():
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    from conccl.launch import run_per_gpu
    out_dir = os.environ.get("OUT", ".")
    results = run_per_gpu(_rank, out_dir)
    for r, res in enumerate(results):
        slim = {k: ({m: v for m, v in rec.items() if not m.startswith("profile")} if isinstance(rec, dict) and k != "counters" else rec)
                for k, rec in res.items()}
        with open(os.path.join(out_dir, f"host_tp_r{r}.json"), "w") as f:
            json.dump(slim, f, indent=1)
    for name, rec in results[0].items():
        for mode in ("graphs", "driver calls"):
            text = rec.get(f"profile {mode}") if isinstance(rec, dict) else None
            if text:
                fname = "host_tp_" + (name + " " + mode).replace(" ", "_") + ".txt"
                with open(os.path.join(out_dir, fname), "w") as f:
                    f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
