"""Per-rank GPU state of the measured study and how it times, as the paper took its numbers.

Every timing is ``warmup`` executions then ``iters`` timed ones (the paper: 6 + 9), each
configuration's back to back; with ``side_by_side`` the configurations of one scenario (GEMM
alone, collectives alone, every strategy) take turns instead, one execution each per round.
A configuration shorter than ``min_timed_ms / iters`` gets more timed executions (up to
``max_iters``), so that its median stands on at least ``min_timed_ms`` of GPU time: nine runs
of a 0.2 ms decode pair are 2 ms, where one late host launch moves the median. Before each,
the ranks meet at a barrier; each execution is timed between two CUDA events on one stream
that every participating stream joins, and the slowest rank's time counts, execution by
execution.
"""
from __future__ import annotations

import math
import statistics

import torch
import torch.distributed as dist

from .. import runtime
from ..device.partitions import Partitions
from ..planner.profile import ProfileError
from .config import StudyConfig


class Rig:
    """Per-rank GPU state: streams, green contexts and NCCL groups, created once."""

    def __init__(self, rank: int, world: int, cfg: StudyConfig):
        self.torch, self.dist = torch, dist
        self.rank, self.world, self.cfg = rank, world, cfg
        self.device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(self.device)
        self.sm_count = props.multi_processor_count
        self.memory = props.total_memory
        self.gemm_stream = torch.cuda.Stream()
        self.comm_stream = torch.cuda.Stream()
        self.partitions = Partitions(self.device)
        self.device_name = torch.cuda.get_device_name(self.device)
        self.plan_error = None  # why the "auto" strategy cannot run here (a given profile of another GPU)
        self.plan_choice = None  # the profile it plans with (conccl.planner.shipped.Choice)
        try:
            self.plan_choice = runtime.profile_choice(cfg.plan_profile, self.device_name, world)
        except (ProfileError, OSError) as e:  # recorded in the results, the rest of the study runs
            self.plan_error = str(e)

    # -- SM partitions -----------------------------------------------------------------
    def green_stream(self, sms_taken: int):
        """(stream, SMs the GEMM gets); the GEMM stream itself when nothing is taken."""
        if sms_taken <= 0:
            return self.gemm_stream, self.sm_count
        return self.partitions.green_stream(sms_taken)

    def nccl_group(self, ctas: int | None = None, high_priority: bool = False):
        return self.partitions.nccl_group(ctas, high_priority)

    # -- timing ------------------------------------------------------------------------
    def _execute(self, parts):
        """Queue ``parts`` ([(stream, fn)], in launch order) behind one start event; return (start, end)."""
        torch = self.torch
        main = torch.cuda.current_stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(main)
        for stream, fn in parts:
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                fn()
            main.wait_stream(stream)
        end.record(main)
        return start, end

    def _once(self, parts) -> float:
        """One execution of ``parts`` after a barrier: its milliseconds on this rank."""
        self.torch.cuda.synchronize()
        self.dist.barrier()
        start, end = self._execute(parts)
        end.synchronize()
        return start.elapsed_time(end)

    def iterations(self, estimate_ms: float) -> int:
        """Timed runs for a configuration of ``estimate_ms`` per run (the median of its warm-ups,
        0 without): ``iters``, more for a short one (see ``StudyConfig.min_timed_ms``). Every
        rank gets the same number (the slowest rank's estimate counts)."""
        cfg = self.cfg
        est = self.torch.tensor([estimate_ms], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(est, op=self.dist.ReduceOp.MAX)
        return timed_iterations(float(est.item()), cfg.iters, cfg.min_timed_ms, cfg.max_iters)

    def timed(self, parts, poison=None) -> list[float]:
        """Milliseconds of each timed execution, the slowest rank's (same list on every rank)."""
        torch, dist = self.torch, self.dist
        runs = self.iterations(_median([self._once(parts) for _ in range(self.cfg.warmup)]))
        times = []
        for i in range(runs):
            if poison is not None and i == runs - 1:
                poison()  # the checked execution must write every byte itself
            times.append(self._once(parts))
        t = torch.tensor(times, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def timed_side_by_side(self, configs) -> list[tuple[list[float], bool | None]]:
        """Time several configurations of one scenario in turn rather than one after another.

        ``configs``: [(parts, poison, check)]. Each is warmed up ``warmup`` times; then come
        rounds (``iters``, more when the longest configuration is short, see
        :meth:`iterations`), and every round runs each configuration once, so that drift over
        the run (clocks, heat, the other ranks' timing) touches all of them alike and the
        comparison between strategies is fair. In the last round each configuration's output is
        poisoned before its execution and ``check()`` runs right after it (None: not checked).
        Returns per configuration (milliseconds of the slowest rank, correct).
        """
        torch, dist = self.torch, self.dist
        rounds = self.iterations(max(_median([self._once(parts) for _ in range(self.cfg.warmup)])
                                     for parts, _, _ in configs))
        times: list[list[float]] = [[] for _ in configs]
        correct: list[bool | None] = [None] * len(configs)
        for i in range(rounds):
            last = i == rounds - 1
            for j, (parts, poison, check) in enumerate(configs):
                if last and poison is not None:
                    poison()
                times[j].append(self._once(parts))
                if last and check is not None:
                    correct[j] = check()
        t = torch.tensor(times, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return list(zip(t.tolist(), correct))

    def all_true(self, ok: bool) -> bool:
        t = self.torch.tensor([1 if ok else 0], device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return bool(t.item())


def _median(ms: list[float]) -> float:
    return statistics.median(ms) if ms else 0.0


def timed_iterations(estimate_ms: float, iters: int, min_timed_ms: float, max_iters: int) -> int:
    """How many timed runs a configuration of ``estimate_ms`` per run gets: enough to cover
    ``min_timed_ms``, at least ``iters`` and at most ``max(iters, max_iters)``."""
    if estimate_ms <= 0 or min_timed_ms <= 0:
        return iters
    return max(iters, min(max_iters, math.ceil(min_timed_ms / estimate_ms)))

