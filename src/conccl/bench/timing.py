"""Implementations timed in turn on every rank, and the figures the ranks agree on.

``conccl bench tp`` and its ``--block`` time the implementations of one case in rounds that
run each once, in turn, so clock and power drift falls on all of them alike
(:func:`timed_in_turn`). Before each run the GPU sleeps longer than the host takes to queue it
(:data:`HOST_AHEAD_CYCLES`, or :func:`sleep_cycles_for` measured), so the CUDA events time the
GPU's work and not the host's launches. A figure is the slowest rank's median and spread
(:func:`slowest`, which ``conccl bench moe`` reports too).
"""
from __future__ import annotations

import statistics
import time

CYCLES_PER_MS = 2_000_000  # the sleep kernel's cycles per millisecond, about, at H100/H200 clocks
HOST_AHEAD_CYCLES = CYCLES_PER_MS  # ~1 ms: longer than queueing any run of the op bench


def timed_in_turn(torch, fns: list, warmup: int, runs: int, host: list | None = None,
                  sleep_cycles: int = HOST_AHEAD_CYCLES, align=None) -> list[list[float]]:
    """Milliseconds per run of each of ``fns``, timed in rounds that run each once, in turn.
    ``host``: a list that receives, per fn, the host's milliseconds to queue each run;
    ``sleep_cycles``: the GPU's sleep before each run, longer than the host's queueing of it;
    ``align``: queued after the sleep, before the start event (``conccl.bench.tp.TPBenchConfig.align``)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out: list[list[float]] = [[] for _ in fns]
    queued: list[list[float]] = [[] for _ in fns]
    for i in range(warmup + runs):
        for j, fn in enumerate(fns):
            # The GPU sleeps while the host queues the run: the events time the GPU's work, not
            # the host's launches (which a training step's host, running ahead, hides; where it
            # cannot, at small shapes, the host time is the figure: ``host``).
            torch.cuda._sleep(sleep_cycles)
            if align is not None:
                align()
            start.record()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            end.record()
            end.synchronize()
            if i >= warmup:
                out[j].append(start.elapsed_time(end))
                queued[j].append(1e3 * (t1 - t0))
    if host is not None:
        host[:] = queued
    return out


def sleep_cycles_for(torch, fns) -> int:
    """Sleep cycles that outlast the host's queueing of the slowest implementation (x1.5; each
    timed on its second call, the first having loaded kernels and made programs; at most 50 ms)."""
    worst = 0.0
    for fn in fns:
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            took = time.perf_counter() - t0
        worst = max(worst, took)
    torch.cuda.synchronize()
    return int(min(50.0, max(1.0, 1.5e3 * worst)) * CYCLES_PER_MS)


def aligner(torch, dist, dev):
    """A one-element NCCL all-reduce on the current stream: every rank's GPU leaves it within
    microseconds of the others (``conccl.bench.tp.TPBenchConfig.align``)."""
    one = torch.zeros(1, device=dev)
    return lambda: dist.all_reduce(one)


def every_rank(dist, world: int, mine) -> list:
    """Every rank's ``mine`` (a picklable object), in rank order."""
    if world == 1:
        return [mine]
    every = [None] * world
    dist.all_gather_object(every, mine)
    return every


def slowest(dist, world: int, ms: list[float]) -> tuple[float, float]:
    """(slowest rank's median, its spread) over the group."""
    return max(every_rank(dist, world, (statistics.median(ms), (max(ms) - min(ms)) / statistics.median(ms))))
