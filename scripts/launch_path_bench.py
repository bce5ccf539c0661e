"""Host time of conccl's launch path on ranks sharing one GPU: per persistent start and per
eager 1 MiB call (all-gather and reduce-scatter), wall clock on the host, the slowest rank.

For "behaviour unchanged, not slower" checks of a refactor: run it against two checkouts in
one session (PYTHONPATH picks which) and compare. The ranks share the GPU's engines, so the
GPU time says nothing; the host time per call is what the launch path costs.

    PYTHONPATH=src python3 scripts/launch_path_bench.py [--world 2] [--calls 2000] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rig():
    """The shared-GPU rig's peer memory (scripts/shared_gpu_smoke.py), for this checkout's conccl."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import shared_gpu_smoke as smoke
    from conccl import api, fsdp
    import importlib
    try:
        cuda_ce = importlib.import_module("conccl.executors.cuda.executor")
    except ImportError:  # a checkout from before executors/cuda/ (the older side of a comparison)
        cuda_ce = importlib.import_module("conccl.executors.cuda_ce")

    mem = smoke.IpcPeerMemory()
    api.symm_mem = cuda_ce.symm_mem = fsdp.symm_mem = mem
    try:
        from conccl.group import make
        make.symm_mem = mem
    except ImportError:  # a checkout from before group/make.py
        pass


def _per_call_us(fn, calls: int, repeats: int = 5) -> float:
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        for i in range(calls):
            fn()
            if i % 64 == 63:  # keep the queue short: the host, not a full queue, is timed
                torch.cuda.synchronize()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(out)


def _worker(rank, world, port, calls, queue):
    os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    _rig()
    import conccl

    n = (1 << 20) // 2  # 1 MiB of bf16 per rank's output
    inp = torch.randn(n // world, device="cuda").to(torch.bfloat16)
    out = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    rs_in = torch.randn(n, device="cuda").to(torch.bfloat16)
    rs_out = torch.empty(n // world, device="cuda", dtype=torch.bfloat16)
    op = conccl.persistent_all_gather_into_tensor(out, inp)
    res = {
        "persistent_all_gather_start_us": _per_call_us(op.start, calls),
        "eager_all_gather_1MiB_us": _per_call_us(lambda: conccl.all_gather_into_tensor(out, inp), calls),
        "eager_reduce_scatter_1MiB_us": _per_call_us(lambda: conccl.reduce_scatter_tensor(rs_out, rs_in), calls),
    }
    torch.cuda.synchronize()
    every = [None] * world
    dist.all_gather_object(every, res)
    conccl.destroy()
    dist.destroy_process_group()
    if rank == 0:
        queue.put({k: max(r[k] for r in every) for k in res})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from shared_gpu_smoke import free_port_any

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port_any()
    procs = [ctx.Process(target=_worker, args=(r, a.world, port, a.calls, queue)) for r in range(a.world)]
    for p in procs:
        p.start()
    res = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    import conccl

    res.update({"world": a.world, "calls": a.calls, "conccl_from": os.path.dirname(conccl.__file__)})
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
