"""Reduce-scatter alone, conccl against NCCL: time per call (median of 10 after 3 warm-ups,
slowest rank) and bus bandwidth, bf16, and the reduction kernel's time from the profiler.
Run: python3 scripts/rs_speed.py (one process per GPU)."""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import conccl
from conccl.launch import run_per_gpu


def _time(fn, iters=10, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return ts


def _rank(rank, world):
    rows = []
    for mib in (64, 256, 1024):
        n = (mib << 20) // 2  # output elements, bf16
        inp = torch.randn(world * n, device="cuda").to(torch.bfloat16)
        out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        for impl, fn in (("conccl", lambda: conccl.reduce_scatter_tensor(out, inp)),
                         ("nccl", lambda: dist.reduce_scatter_tensor(out, inp))):
            dist.barrier()
            rows.append((impl, mib, _time(fn)))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            conccl.reduce_scatter_tensor(out, inp)
            torch.cuda.synchronize()
        k = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith("reduce")]
        rows.append(("kernel", mib, [e.device_time / 1e3 for e in k], [e.name for e in k]))
    return rows


if __name__ == "__main__":
    per_rank = run_per_gpu(_rank)
    world = len(per_rank)
    for rows in zip(*per_rank):
        impl, mib = rows[0][0], rows[0][1]
        if impl == "kernel":
            print(f"{mib} MiB output: reduction kernel {rows[0][3]} {max(r[2][0] for r in rows):.3f} ms "
                  f"(reads {world}x, writes 1x the output: {(world + 1) * mib * 2**20 / max(r[2][0] for r in rows) / 1e6:.0f} GB/s)")
            continue
        slowest = [max(t) for t in zip(*(r[2] for r in rows))]
        med = statistics.median(slowest)
        busbw = (world - 1) * mib * 2**20 / (med / 1e3) / 1e9
        print(f"{impl:7s} {mib:5d} MiB output: {med:.3f} ms (min {min(slowest):.3f}, max {max(slowest):.3f}), busbw {busbw:.1f} GB/s")
