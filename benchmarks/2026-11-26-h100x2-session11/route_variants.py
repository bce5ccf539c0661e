"""Why an eager call routed to NCCL by conccl costs more than the same torch.distributed call:
host us per call (2000 calls back to back, slowest rank) of the plain NCCL call before conccl's
group exists, after it exists, after conccl's own calls ran, and of the routed call with parts of
the route taken away (monkeypatched), with the garbage collector on and off.

    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session11/route_variants.py [SIZE_BYTES]
"""
import gc
import json
import sys
import time

import torch
import torch.distributed as dist

import conccl
from conccl.api import get_group
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
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def worker(rank, world, size):
    dev = torch.device("cuda", torch.cuda.current_device())
    inp = torch.ones(size // 2 // world, dtype=torch.bfloat16, device=dev)
    out = torch.empty(size // 2, dtype=torch.bfloat16, device=dev)
    nccl = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
    ours = lambda: conccl.all_gather_into_tensor(out, inp)  # noqa: E731
    res = {"nccl_before_group": _host_us(nccl)}
    g = get_group(None)
    res["nccl_after_group"] = _host_us(nccl)
    conccl.set_eager_path("copy_engines")
    res["conccl"] = _host_us(ours)
    res["nccl_after_conccl_calls"] = _host_us(nccl)
    conccl.set_options(nccl_below={"all_gather": 1 << 40})
    res["routed"] = _host_us(ours)
    ex = type(g.executor)
    run_fallback = ex.run_fallback
    try:
        ex.run_fallback = lambda self, fn, async_op, tensors: fn()
        res["routed_no_run_fallback"] = _host_us(ours)
    finally:
        ex.run_fallback = run_fallback
    res["group_call_fallback_direct"] = None  # (never measured: the probe named a helper it lacked)
    gc.disable()
    res["routed_gc_off"] = _host_us(ours)
    res["nccl_gc_off"] = _host_us(nccl)
    gc.enable()
    res["nccl_again"] = _host_us(nccl)
    res["routed_again"] = _host_us(ours)
    conccl.set_options(nccl_below={})
    return res


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 65536
    out = run_per_gpu(worker, size)
    print(json.dumps({"size": size, "host_us_slowest_rank": {k: (None if out[0][k] is None else round(max(r[k] for r in out), 1))
                                                          for k in out[0]}}))
