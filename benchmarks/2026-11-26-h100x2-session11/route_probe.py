"""Host time of an eager call that set_eager_path("auto") routes to NCCL, against the same
torch.distributed call made directly, and conccl's own path: us per call queued back to back
(wall clock around N calls, then the GPU drained), the slowest rank; plus a cProfile of the
routed calls on rank 0.

    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session11/route_probe.py [SIZE_BYTES]
"""
import cProfile
import io
import json
import pstats
import sys
import time

import torch
import torch.distributed as dist

import conccl
from conccl.launch import run_per_gpu

N = 2000


def _host_us(fn, n=N):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / n * 1e6
    return host, wall


def worker(rank, world, size):
    dev = torch.device("cuda", torch.cuda.current_device())
    inp = torch.ones(size // 2 // world, dtype=torch.bfloat16, device=dev)
    out = torch.empty(size // 2, dtype=torch.bfloat16, device=dev)
    res = {}
    res["nccl"] = _host_us(lambda: dist.all_gather_into_tensor(out, inp))
    conccl.set_eager_path("copy_engines")
    res["conccl"] = _host_us(lambda: conccl.all_gather_into_tensor(out, inp))
    conccl.set_options(nccl_below={"all_gather": 1 << 40})
    res["routed"] = _host_us(lambda: conccl.all_gather_into_tensor(out, inp))
    text = _profile(lambda: conccl.all_gather_into_tensor(out, inp), "routed to NCCL")
    conccl.set_options(nccl_below={})
    text += _profile(lambda: conccl.all_gather_into_tensor(out, inp), "conccl's own path")
    return res, text if rank == 0 else ""


def _profile(fn, what):
    p = cProfile.Profile()
    p.enable()
    _host_us(fn, 1000)
    p.disable()
    s = io.StringIO()
    pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(30)
    return f"\n=== {what} ===\n" + s.getvalue()


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 65536
    out = run_per_gpu(worker, size)
    slow = {k: [max(r[0][k][i] for r in out) for i in (0, 1)] for k in out[0][0]}
    print(json.dumps({"size": size, "host_wall_us_slowest_rank": slow}))
    print(out[0][1])
