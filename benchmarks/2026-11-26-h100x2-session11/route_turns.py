"""Where a routed eager call's extra time goes: the same all-gather through each layer of
conccl's route to NCCL, in turns (round after round, each variant BLOCK calls back to back),
host us per call, the median over rounds of the slowest rank.

    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session11/route_turns.py [SIZE_BYTES]
"""
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import conccl
from conccl.api import get_group
from conccl.collectives import get as get_collective
from conccl.launch import run_per_gpu

BLOCK, ROUNDS = 200, 25


def worker(rank, world, size):
    dev = torch.device("cuda", torch.cuda.current_device())
    inp = torch.ones(size // 2 // world, dtype=torch.bfloat16, device=dev)
    out = torch.empty(size // 2, dtype=torch.bfloat16, device=dev)
    g = get_group(None)
    world_pg = dist.group.WORLD
    coll = get_collective("all_gather")
    mark = torch.cuda.Event()
    conccl.set_options(nccl_below={"all_gather": 1 << 40})

    def with_mark():
        coll.call_with(dist, out, inp, (), group=world_pg, async_op=False)
        mark.record()

    variants = {
        "dist(out, inp)": lambda: dist.all_gather_into_tensor(out, inp),
        "dist(group=WORLD, async_op=False)": lambda: dist.all_gather_into_tensor(out, inp, group=world_pg,
                                                                                 async_op=False),
        "coll.call_with(dist)": lambda: coll.call_with(dist, out, inp, (), group=world_pg, async_op=False),
        "call_with + event record": with_mark,
        "executor.run_fallback": lambda: g.executor.run_fallback(
            lambda: coll.call_with(dist, out, inp, (), group=world_pg, async_op=False), False, (inp, out)),
        "Group._call_fallback": lambda: g._call_fallback(coll, out, inp, (), False),
        "Group.call(route=True)": lambda: g.call(coll, out, inp, (), route=True),
        "conccl.all_gather_into_tensor (routed)": lambda: conccl.all_gather_into_tensor(out, inp),
    }
    us = {k: [] for k in variants}
    for fn in variants.values():
        for _ in range(20):
            fn()
    for _ in range(ROUNDS):
        for name, fn in variants.items():
            torch.cuda.synchronize()
            dist.barrier()
            t = time.perf_counter()
            for _ in range(BLOCK):
                fn()
            torch.cuda.synchronize()
            us[name].append((time.perf_counter() - t) / BLOCK * 1e6)
    conccl.set_options(nccl_below={})
    t = torch.tensor([us[k] for k in variants], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {k: row for k, row in zip(variants, t.tolist())}


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 65536
    res = run_per_gpu(worker, size)[0]
    print(json.dumps({"size": size, "rounds": ROUNDS, "block": BLOCK,
                      "median_us": {k: round(statistics.median(v), 1) for k, v in res.items()},
                      "min_us": {k: round(min(v), 1) for k, v in res.items()}}, indent=1))
