"""Where a MoE dispatch and combine spend their time, on 2 GPUs: the host's profile (cProfile,
rank 0) of conccl.ep's and the reference's calls, each call's phases on the GPU's clock, and
how many copy-engine programs conccl compiled during the timed calls.

    PYTHONPATH=src python3 scripts/ep_profile.py [--tokens 4096 --hidden 7168] > ep_profile.txt
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.distributed as dist


def _rank(rank, world, a):
    import conccl
    from conccl.bench.moe import routing
    from conccl.bench.moe_reference import reference_combine, reference_dispatch
    from conccl import ep

    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(a.tokens, a.hidden, device=dev).to(torch.bfloat16)
    routes = [routing(torch, "random", a.tokens, 8, 2, rank + 7919 * i, dev) for i in range(10)]
    turn = [0]

    def route():  # a new routing every call, as training has (a.same: one for all)
        turn[0] += 1
        return routes[0 if a.same else turn[0] % len(routes)]
    g = conccl.get_group()
    ex = g.executor
    out = []

    def c_both():
        idx, w = route()
        e, counts, h = ep.dispatch(x, idx, w, 8)
        return ep.combine(e, h)

    def r_both():
        idx, w = route()
        e, counts, h = reference_dispatch(x, idx, w, 8)
        return reference_combine(e, h)

    for name, fn in (("conccl", c_both), ("reference", r_both)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        compiled, compile_s = getattr(ex, "programs_compiled", 0), getattr(ex, "program_compile_s", 0.0)
        t0 = time.perf_counter()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        prof.disable()
        wall = (time.perf_counter() - t0) / 10 * 1e3
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
        out.append(f"== {name}: {wall:.3f} ms per dispatch+combine (host wall, profiled), "
                   f"programs compiled in 10 calls: {getattr(ex, 'programs_compiled', 0) - compiled} "
                   f"({1e3 * (getattr(ex, 'program_compile_s', 0.0) - compile_s):.2f} ms)\n{s.getvalue()}")
    return out if rank == 0 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--same", action="store_true", help="one routing for every call (default: a new one each)")
    a = ap.parse_args()
    from conccl.launch import run_per_gpu

    for text in run_per_gpu(_rank, a)[0]:
        print(text)


if __name__ == "__main__":
    main()
