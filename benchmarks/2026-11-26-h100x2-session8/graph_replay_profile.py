"""What one replay of captured conccl calls runs (kernels, copy kinds, their durations), to see
why a few cases of run1 (all-gather push 64K, all-to-all pull 64K) took ~10 us a call more
after the own copy was forked off the signal chain, while their neighbours took ~8 us less.
Two ranks, one per GPU, cases as ``conccl bench graphs`` builds them (conccl.bench.impls).

    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session8/graph_replay_profile.py --out DIR
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics

import torch

CASES = [("all_gather", "conccl_symm_push", s) for s in (4096, 65536, 1 << 20)] + \
        [("all_to_all", "conccl_symm_pull", s) for s in (4096, 65536, 1 << 20)] + \
        [("all_gather", "conccl_symm_pull", 65536), ("all_to_all", "conccl_symm_push", 65536)]
CALLS = 20


def _probe(rank, world):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import conccl
    from conccl.bench.impls import implementations
    from conccl.bench.variant import Variant
    from conccl.bench.run import make_case, max_bytes
    from conccl.collectives import get

    out = []
    for coll_name, impl_name, size in CASES:
        coll = get(coll_name)
        inp, outp, _ = make_case(coll, size, world, rank, torch.bfloat16, "cuda")
        ctx = {"max_bytes": max_bytes([coll], [size], world, 2)}
        # the names as recorded: conccl with conccl.empty tensors, push or pull (today's --tensors/--algorithm)
        impl = implementations(Variant("symmetric", impl_name.rsplit("_", 1)[1]))["conccl"]
        run, _ = impl.setup(coll, inp, outp, ctx)
        for _ in range(CALLS):
            run()
        torch.cuda.synchronize()
        dist.barrier()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            for _ in range(CALLS):
                run()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            dist.barrier()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(10):
                g.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1000 / (10 * CALLS))
        dist.barrier()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
        kinds = collections.defaultdict(list)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kinds[e.name].append(e.device_time)
        out.append({"collective": coll_name, "impl": impl_name, "bytes": size, "us_per_call": statistics.median(times),
                    "events": {k: [len(v), statistics.mean(v)] for k, v in sorted(kinds.items())}})
        del g
        torch.cuda.synchronize()
        conccl.destroy()
        dist.barrier()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from conccl.launch import run_per_gpu

    res = run_per_gpu(_probe, nprocs=2, timeout_s=500)
    d = pathlib.Path(args.out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "graph_replay_profile.json").write_text(json.dumps(res, indent=1))
    for rank, cases in enumerate(res):
        for c in cases:
            ev = ", ".join(f"{k[:40]} x{n} {t:.1f}us" for k, (n, t) in c["events"].items())
            print(f"r{rank} {c['collective']} {c['impl']} {c['bytes']}: {c['us_per_call']:.1f} us/call; {ev}")


if __name__ == "__main__":
    main()
