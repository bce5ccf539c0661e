"""What posting settled in-place all-reduces saves on the host (CPU, the reference group).

Two ranks make N in-place all-reduces (``conccl.all_reduce``'s form) of one tensor, each after
host work that alternates between the ranks (rank 0 slow on even calls, rank 1 on odd ones, as
two hosts' Python does in a real step); the executor's run is stubbed (no copies: the Group
layer and the board only). With ``post_settled`` on, a settled call posts its row and goes on;
off, every call waits for the peer's row, so the ranks move in lockstep with the slower one.

    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session9/all_reduce_post_probe.py [--calls N]
"""
from __future__ import annotations

import argparse
import time

import torch

from conccl.collectives.all_reduce import ALL_REDUCE
from conccl.launch import spawn
from conccl.work import Work


def spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _calls(comm, calls: int, work_us: float):
    comm.executor.run = lambda *a, **k: Work()  # the Group layer and the board only
    buf = torch.ones(4096)
    out = {}
    for post in (False, True):
        comm.options.post_settled = post
        for _ in range(10):  # settled
            comm.call(ALL_REDUCE, buf, buf, (None,))
        comm.exchange_values([0], "sync")
        posts = comm.board.posts
        t = time.perf_counter()
        for i in range(calls):
            spin(work_us * (3 if i % 2 == comm.rank else 1))
            comm.call(ALL_REDUCE, buf, buf, (None,))
        comm.exchange_values([0], "sync")
        out[post] = ((time.perf_counter() - t) / calls * 1e6, comm.board.posts - posts)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--work-us", type=float, default=20.0)
    args = ap.parse_args()
    for rank, out in enumerate(spawn(2, _calls, args.calls, args.work_us, join_timeout_s=600)):
        for post, (us, posts) in out.items():
            print(f"rank {rank} post_settled={post}: {us:.1f} us per call ({posts} of {args.calls} posted; "
                  f"work {args.work_us} us, 3x on alternate calls)")


if __name__ == "__main__":
    main()
