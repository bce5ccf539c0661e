"""The host time of conccl's Group layer per settled call, the executor's run stubbed out (what
the call key, the board's post and the execute step cost around the executor), on the CPU
reference group: one rank (nothing to wait for) or two (their Python meeting on the board).

    PYTHONPATH=src python3 benchmarks/2026-11-26-h100x2-session8/group_host_probe.py [WORLD] [--prof]

On the 2-core CPU machine, 2026-11-26 (bd2ee76): world 1 11.5 us per call; world 2 44-86 us
(two spinning processes on two cores: the board's wait for the peer, not representative).
"""
import cProfile
import io
import pstats
import sys
import time

import torch

from conccl.collectives.all_gather import ALL_GATHER
from conccl.launch import spawn
from conccl.work import Work


def _calls(comm, n, prof):
    comm.executor.run = lambda *a, **k: Work()  # the executor's part: not measured here
    inp, out = torch.ones(1024), torch.empty(1024 * comm.world)
    for _ in range(50):  # settled: posted, not exchanged
        comm.call(ALL_GATHER, out, inp, ())
    t = time.perf_counter()
    for _ in range(n):
        comm.call(ALL_GATHER, out, inp, ())
    us = (time.perf_counter() - t) / n * 1e6
    text = ""
    if prof:
        p = cProfile.Profile()
        p.enable()
        for _ in range(n):
            comm.call(ALL_GATHER, out, inp, ())
        p.disable()
        s = io.StringIO()
        pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(15)
        text = s.getvalue() if comm.rank == 0 else ""
    return us, text


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 1
    res = spawn(world, _calls, 20000, "--prof" in sys.argv)
    print("us per call, each rank:", [round(r[0], 2) for r in res])
    if res[0][1]:
        print(res[0][1])
