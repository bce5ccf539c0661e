"""What the host board costs a call, exchanged or posted (CPU, two processes).

Each rank makes N calls of host work (``--work-us`` of spinning) and one board operation: a
blocking ``HostBoard.exchange`` (every rank waits for every row, as every call did before) or a
``HostBoard.post`` (a settled call: publish and go on; rows compared later). With ``--skew``
the ranks' work alternates (rank 0 slow on even calls, rank 1 on odd ones), as two hosts'
Python does in a real step: in lockstep every call then waits for the slower rank, posted the
ranks drift apart within the ring and catch up.

    PYTHONPATH=src python benchmarks/2026-11-26-h100x2-session4/board_post_cpu.py [--skew]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import numpy as np

from conccl.board import HostBoard


def spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def rank_main(rank, name, calls, work_us, skew, out):
    board = HostBoard(name, rank, 2, 4, create=False)
    for mode in ("exchange", "post"):
        board.exchange([0, 0, 0, 0], "sync", 30.0)  # start together
        t0 = time.perf_counter()
        for i in range(calls):
            slow = skew and (i % 2 == rank)
            spin(work_us * (3 if slow else 1) if skew else work_us)
            row = [7, i, 0, 0]
            if mode == "exchange":
                board.exchange(row, "x", 30.0)
            else:
                board.post(row, np.array([row, row]), "x", i, 30.0)
        board.exchange([0, 0, 0, 0], "sync", 30.0)  # every post compared by now
        out.put((rank, mode, (time.perf_counter() - t0) / calls * 1e6, board.pending_posts))
    board.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--work-us", type=float, default=20.0)
    ap.add_argument("--skew", action="store_true")
    args = ap.parse_args()
    name = f"conccl_bpc_{os.getpid()}"
    owner = HostBoard(name, 0, 2, 4, create=True)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, name, args.calls, args.work_us, args.skew, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    res = [q.get(timeout=300) for _ in range(4)]
    for p in procs:
        p.join()
    owner.close()
    for mode in ("exchange", "post"):
        per = {r: us for r, m, us, _ in res if m == mode}
        print(f"{mode:8s} us per call (work {args.work_us} us{', skewed 3x on alternate calls' if args.skew else ''}): "
              f"rank 0 {per[0]:.1f}, rank 1 {per[1]:.1f}")


if __name__ == "__main__":
    main()
