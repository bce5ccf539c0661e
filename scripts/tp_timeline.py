"""Where the time of an all-gather+GEMM pipeline goes on two GPUs: one profiled call per
implementation, the GPU timeline of rank 0 (every kernel and copy: stream, start, duration).

`conccl bench tp` on 2 x H100 (benchmarks/2026-11-25-h100x2) measured conccl's `direct`
schedule at 1.06-1.21x of the GEMM alone where the planner's model (the shipped H100 table)
predicts 0.99-1.07x, and finer
grains and PyTorch's async-TP 2-10% faster. This separates the candidates: GEMM kernels slower
beside the copies (contention), the GEMM stream idle while it waits for rows (exposed transfer),
host gaps, and the staging copy of a plain-tensor shard into the symmetric workspace.

    PYTHONPATH=src python3 scripts/tp_timeline.py --shape 8192x8192x14336 --json OUT.json

Needs 2 or more GPUs. Prints, per implementation: wall time of the call (CUDA events, median of
10), the GEMM kernels' summed time against the GEMM alone, the GEMM stream's idle time inside
the call, and every copy (start and end relative to the call's first GPU activity).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist


def _trace(fn):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name)).get("traceEvents", [])
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return []
    t0 = min(e["ts"] for e in gpu)
    return sorted(({"stream": e.get("args", {}).get("stream", e.get("tid")), "cat": e["cat"], "name": e["name"][:80],
                    "start_us": round(e["ts"] - t0, 1), "dur_us": round(e.get("dur", 0), 1)} for e in gpu),
                  key=lambda e: e["start_us"])


def _is_gemm(name: str) -> bool:
    n = name.lower()
    return any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90"))


def _summary(timeline, gemm_alone_us):
    gemms = [e for e in timeline if e["cat"] == "kernel" and _is_gemm(e["name"])]
    if not gemms:
        return {}
    stream = statistics.mode(e["stream"] for e in gemms)
    on = sorted((e for e in timeline if e["stream"] == stream), key=lambda e: e["start_us"])
    span = on[-1]["start_us"] + on[-1]["dur_us"] - on[0]["start_us"]
    busy = sum(e["dur_us"] for e in on)
    return {"gemm_kernels": len(gemms), "gemm_us": round(sum(e["dur_us"] for e in gemms), 1),
            "gemm_over_alone": round(sum(e["dur_us"] for e in gemms) / gemm_alone_us, 3),
            "gemm_stream_idle_us": round(span - busy, 1),
            "first_gemm_start_us": gemms[0]["start_us"],
            "copies": [(e["stream"], e["name"][:40], e["start_us"], round(e["start_us"] + e["dur_us"], 1))
                       for e in timeline if e["cat"] == "gpu_memcpy"]}


def _rank(rank, world, shapes, schedules):
    import conccl
    ctp = conccl.tp  # a lazy attribute (conccl.integrations.tp), not a module to import
    from torch.distributed import _symmetric_memory as symm_mem

    group_name = dist.group.WORLD.group_name
    symm_mem.enable_symm_mem_for_group(group_name)
    out = []
    for M, K, N in shapes:
        g = torch.Generator(device="cuda").manual_seed(rank)
        a = torch.randn(M // world, K, device="cuda", dtype=torch.bfloat16, generator=g)
        a_symm = conccl.empty(M // world, K, dtype=torch.bfloat16)
        a_symm.copy_(a)
        w = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=torch.Generator(device="cuda").manual_seed(9))
        full = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
        impls = {"gemm_alone": lambda: torch.mm(full, w)}
        for s in schedules:
            impls[f"conccl {s}"] = lambda s=s: ctp.all_gather_matmul(a, w, schedule=s)
            impls[f"conccl {s}, shard in conccl.empty"] = lambda s=s: ctp.all_gather_matmul(a_symm, w, schedule=s)
        impls["torch async-TP"] = lambda: torch.ops.symm_mem.fused_all_gather_matmul(a, [w], 0, group_name)
        rec = {"shape": f"{M}x{K}x{N}", "impls": {}}
        for name, fn in impls.items():
            for _ in range(3):
                fn()
            times = []
            for _ in range(10):
                torch.cuda.synchronize()
                dist.barrier()
                torch.cuda._sleep(2_000_000)  # the host queues the call before the start event fires
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e) * 1e3)
            timeline = _trace(fn)
            rec["impls"][name] = {"us": round(statistics.median(times), 1), "timeline": timeline if rank == 0 else None}
        alone = rec["impls"]["gemm_alone"]["us"]
        for name, r in rec["impls"].items():
            r["over_alone"] = round(r["us"] / alone, 3)
            if r["timeline"]:
                r["summary"] = _summary(r["timeline"], alone)
        out.append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192x8192x14336,4096x8192x8192", help="MxKxN,... (M: the gathered rows)")
    ap.add_argument("--schedules", default="direct,direct-p2,ring-p2")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if torch.cuda.device_count() < 2:
        print("needs 2 or more GPUs", file=sys.stderr)
        return 2
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    from conccl.launch import run_per_gpu

    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shape.split(",")]
    results = run_per_gpu(_rank, shapes, a.schedules.split(","))
    for rec in results[0]:
        print(f"\n{rec['shape']} (rank 0; slowest rank's wall time in the JSON)")
        for name, r in rec["impls"].items():
            slowest = max(res[[x["shape"] for x in res].index(rec["shape"])]["impls"][name]["us"] for res in results)
            sm = r.get("summary", {})
            print(f"  {name:<38} {r['us']:8.1f} us (slowest rank {slowest:8.1f}) {r['over_alone']:.3f}x | GEMM kernels "
                  f"{sm.get('gemm_kernels')} {sm.get('gemm_us')} us = {sm.get('gemm_over_alone')}x alone, GEMM stream idle "
                  f"{sm.get('gemm_stream_idle_us')} us, first GEMM at {sm.get('first_gemm_start_us')} us")
            for c in sm.get("copies", [])[:8]:
                print(f"      copy stream {c[0]} {c[1]:<40} {c[2]:8.1f} .. {c[3]:8.1f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
