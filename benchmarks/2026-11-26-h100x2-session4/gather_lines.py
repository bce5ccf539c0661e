"""Where the host time of the direct gather goes, line by line (issue 40 item 5).

cProfile gave ``fsdp_direct.gather._gather_from_home`` ~0.23 ms of own time per call (run1,
run2): time in its own lines, not in the Python functions it calls. Here a line tracer on that
function alone adds each line's time (callees included) over a few forward+backward steps of
the bench's model under ``direct=True``, rank 0.

    torchrun --nproc-per-node 2 benchmarks/2026-11-26-h100x2-session4/gather_lines.py [--tokens 2048]
"""
from __future__ import annotations

import argparse
import linecache
import os
import sys
import time
from collections import defaultdict

import torch
import torch.distributed as dist

from conccl.bench.fsdp import ModelShape, build
from conccl.fsdp_direct import gather


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    device = torch.device("cuda", torch.cuda.current_device())
    model, comms = build("conccl_direct", ModelShape(), device)
    x = torch.randn(1, args.tokens, ModelShape().dim, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        model(x).float().pow(2).mean().backward()
    torch.cuda.synchronize()
    code = gather._gather_from_home.__code__
    spent, hits, state, calls = defaultdict(float), defaultdict(int), {}, [0]

    def local(frame, event, arg):
        now = time.perf_counter()
        if "line" in state:
            spent[state["line"]] += now - state["t"]
        if event == "line":
            state["line"], state["t"] = frame.f_lineno, time.perf_counter()
            hits[frame.f_lineno] += 1
        elif event == "return":
            state.pop("line", None)
        return local

    def tracer(frame, event, arg):
        if frame.f_code is code:
            calls[0] += 1
            return local
        return None

    t0 = time.perf_counter()
    if rank == 0:
        sys.settrace(tracer)
    for _ in range(args.steps):
        model(x).float().pow(2).mean().backward()
    sys.settrace(None)
    wall = (time.perf_counter() - t0) * 1e3 / args.steps
    torch.cuda.synchronize()
    if rank == 0:
        print(f"{calls[0]} calls of _gather_from_home in {args.steps} steps ({wall:.1f} ms per step traced); "
              "us per call by line (callees included):")
        for line in sorted(spent):
            print(f"{line:4d} {1e6 * spent[line] / max(1, calls[0]):9.1f} us  x{hits[line] / max(1, calls[0]):.0f}  "
                  f"{linecache.getline(code.co_filename, line).rstrip()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
