"""The measured study: one process per GPU, every number as the paper took it.

Every timing is ``warmup`` executions then ``iters`` timed ones (the paper: 6 + 9), each
configuration's back to back; with ``side_by_side`` the configurations of one scenario (GEMM
alone, collectives alone, every strategy) take turns instead, one execution each per round.
A configuration shorter than ``min_timed_ms / iters`` gets more timed executions (up to
``max_iters``), so that its median stands on at least ``min_timed_ms`` of GPU time: nine runs
of a 0.2 ms decode pair are 2 ms, where one late host launch moves the median. Before each,
the ranks meet at a barrier; each execution is timed between two CUDA events on one stream
that every participating stream joins, and the slowest rank's time counts, execution by
execution. Before the last execution of every configuration the output is poisoned, and
after it every rank checks its output against the pattern that NCCL produces (the same check
NCCL's own runs pass), so a strategy that moved nothing or the wrong bytes is caught.

Rank 0 records the numbers as :class:`~conccl.study.results.StudyResults` and saves them after
every step, so an interrupted run keeps what it measured.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import conccl

from .. import collectives, runtime
from ..partition import Partitions
from ..planner.profile import ProfileError
from ..strategy import STRATEGIES, strategies_for
from . import analysis
from .results import (AutoInTurns, CollCtas, CollSize, GemmSmLoss, HbmBytes, Machine, Run, RunConfig, ScenarioResult,
                      StudyResults, Timing, save_results)
from .scenarios import Gemm, Scenario

SIZE_SWEEP = tuple(1 << s for s in (20, 22, 24, 26, 28, 30, 32))  # 1M .. 4G
SIZE_SWEEP_QUICK = tuple(1 << s for s in (20, 24, 28))
CTA_SWEEP = (1, 2, 4, 8, 16, 32)
CTA_SWEEP_QUICK = (1, 4, 16)
CTA_SIZES = (1 << 20, 1 << 30)  # a latency-bound and a bandwidth-bound size
CTA_SIZES_QUICK = (1 << 20, 1 << 28)
SM_LOSS = (0, 8, 16, 32, 64)
SM_LOSS_QUICK = (0, 16, 64)
HBM_PROBE_BYTES = 2 << 30
HEADROOM = 3 << 30  # NCCL buffers, verification temporaries, allocator slack


class StudyError(RuntimeError):
    """The study cannot run as asked (too few GPUs, does not fit in memory, ...)."""


@dataclass
class StudyConfig:
    scenarios: list[Scenario]
    quick: bool = False
    warmup: int = 6
    iters: int = 9
    out_dir: str = "study"
    meta: dict = field(default_factory=dict)
    ncu: dict = field(default_factory=dict)  # GEMM counters read by ncu beforehand (study/ncu.py)
    plan_profile: str | None = None  # hardware profile the "auto" strategy plans with (None: shipped)
    # True: a scenario's configurations take turns, one execution each per round (fairer between
    # strategies under drift; it also shifts the alone baselines, see the README). False: the
    # paper's way, each configuration's warm-ups and timed runs back to back.
    side_by_side: bool = False
    # Short configurations get timed runs until they cover this much GPU time (estimated from
    # the warm-ups, agreed by all ranks), between ``iters`` and ``max_iters`` runs.
    min_timed_ms: float = 20.0
    max_iters: int = 100
    # After a scenario's strategies, time ``auto`` and the fastest measured strategy again, in
    # turns: a fair head-to-head, free of what ran just before each (scripts/auto_gap.py).
    auto_in_turns: bool = True
    # An interrupted run's results to continue: every rank skips the steps it holds (the same
    # steps on every rank, so the collectives still pair up), rank 0 appends the rest.
    resume: StudyResults | None = None


def arena_bytes(scenarios: list[Scenario], world: int, quick: bool) -> tuple[int, int]:
    """Symmetric arenas (output, input) large enough for every scenario and sweep.

    Allocated once: symmetric allocations must have equal sizes on every rank, and the
    allocator may return cached blocks of other sizes if allocations came and went."""
    sweep = max(SIZE_SWEEP_QUICK if quick else SIZE_SWEEP)
    out = max([s.size_for(world) for s in scenarios] + [sweep])
    inp = max([collectives.get(s.collective).input_bytes(s.size_for(world), world) for s in scenarios] + [sweep])
    return out, inp


def required_bytes(scenarios: list[Scenario], world: int, quick: bool) -> int:
    out, inp = arena_bytes(scenarios, world, quick)
    # torch_lc's op allocates its whole output on every call, beside the arenas.
    per = max(s.gemm.bytes() + (s.size_for(world) if STRATEGIES["torch_lc"].runs(s.collective) else 0)
              for s in scenarios)
    return out + inp + per + HEADROOM


# ----------------------------------------------------------------------------- device rig

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
        self.plan_error = None  # why the "auto" strategy cannot run here (no profile for this GPU)
        try:
            runtime.profile_for(cfg.plan_profile, self.device_name)
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


# ------------------------------------------------------------------------ data patterns

def _pattern(src: int, chunk: int, offset: int, n: int, device):
    """Input chunk ``chunk`` of rank ``src``, elements [offset, offset+n), as int16 (bf16 bits)."""
    i = torch.arange(offset, offset + n, dtype=torch.int64, device=device)
    return ((i * 7 + (src * 13 + chunk * 29 + 1)) % 251).to(torch.int16)


PIECE = 1 << 26  # elements per generated piece: bounds the temporaries (512 MiB of int64)


def _values(src: int, chunk: int, offset: int, n: int, device):
    """Input chunk of a reducing collective: whole numbers in [-7, 7] as bf16, so a sum over up
    to 8 ranks (at most 56 in size) is exact in any order, NCCL's and conccl's alike."""
    i = torch.arange(offset, offset + n, dtype=torch.int64, device=device)
    return ((i * 7 + (src * 13 + chunk * 29 + 1)) % 15 - 7).to(torch.bfloat16)


def fill_values(t16, src: int, chunk: int) -> None:
    bf = t16.view(torch.bfloat16)
    for off in range(0, bf.numel(), PIECE):
        n = min(PIECE, bf.numel() - off)
        bf[off:off + n].copy_(_values(src, chunk, off, n, bf.device))


def matches_sum(t16, sources) -> bool:
    """Whether ``t16`` holds the sum of the value chunks ``sources`` ((rank, chunk) pairs)."""
    for off in range(0, t16.numel(), PIECE):
        n = min(PIECE, t16.numel() - off)
        acc = sum(_values(r, k, off, n, t16.device).float() for r, k in sources)
        if not bool((t16[off:off + n] == acc.to(torch.bfloat16).view(torch.int16)).all()):
            return False
    return True


def fill_pattern(t16, src: int, chunk: int) -> None:
    for off in range(0, t16.numel(), PIECE):
        n = min(PIECE, t16.numel() - off)
        t16[off:off + n].copy_(_pattern(src, chunk, off, n, t16.device))


def matches_pattern(t16, src: int, chunk: int) -> bool:
    for off in range(0, t16.numel(), PIECE):
        n = min(PIECE, t16.numel() - off)
        if not bool((t16[off:off + n] == _pattern(src, chunk, off, n, t16.device)).all()):
            return False
    return True


class CollectiveCase:
    """Buffers of one collective in the symmetric arenas, the callables that run it with each
    implementation, and its poison / check, all from the collective's equal-chunk layout:
    input chunk ``k`` of rank ``r`` holds ``pattern(r, k)``, and output chunk ``c`` must end up
    holding the pattern of its source, ``layout.sources[c]``. A collective the study runs in
    place (an all-gather, as FSDP runs it) takes its input from its own output chunk.

    A reducing collective (an output chunk with several sources) gets whole-number values
    instead, and its output chunk must hold their sum; one that reduces a single tensor in
    place (all-reduce) is "poisoned" by restoring its input, which each execution reduces anew."""

    def __init__(self, rig: Rig, collective: str, size: int, arenas):
        self.rig, self.collective, self.size = rig, collective, size
        self.coll = collectives.get(collective)
        w, r = rig.world, rig.rank
        self.layout = lay = self.coll.layout(w, r)
        self.in_place = self.coll.in_place(w)
        self.reducing = any(len(srcs) > 1 for srcs in lay.sources)
        in_bytes = self.coll.input_bytes(size, w)
        out_arena, in_arena = arenas
        self.out = out_arena[:size].view(torch.bfloat16)
        self.out16 = self.out.view(torch.int16)
        if self.coll.single_tensor:  # reduced in place, as torch.distributed.all_reduce
            self.inp = self.out
        elif self.in_place:
            self.inp = self.out.view(lay.output_chunks, -1)[lay.in_place_chunk]
        else:
            self.inp = in_arena[:in_bytes].view(torch.bfloat16)
        ins = self.inp.view(torch.int16).view(lay.input_chunks, -1)
        for k in range(lay.input_chunks):
            (fill_values if self.reducing else fill_pattern)(ins[k], r, k)
        # The tensor an in-place reduction overwrites, to restore before the checked execution.
        self.pristine = in_arena[:in_bytes].view(torch.bfloat16) if self.coll.single_tensor else None
        if self.pristine is not None:
            self.pristine.copy_(self.inp)
        # PyTorch's op takes an input of its own, at the same offset on every rank.
        self.lc_in = in_arena[:in_bytes].view(torch.bfloat16) if self.in_place else self.inp
        if self.in_place:
            self.lc_in.copy_(self.inp)
        self.lc_out = None
        self._conccl_op = None

    def _chunks(self, target):
        t = target if target is not None else self.out
        return t.view(torch.int16).view(self.layout.output_chunks, -1)

    def poison(self, target=None) -> None:
        """Overwrite every output chunk but the one that is the input itself (an in-place
        reduction: restore its input, so the checked execution's result is known)."""
        if self.pristine is not None and target is None:
            self.out.copy_(self.pristine)
            return
        chunks = self._chunks(target)
        for c in range(self.layout.output_chunks):
            if not (self.in_place and c == self.layout.in_place_chunk and target is None):
                chunks[c].fill_(-1)

    def check(self, target=None) -> bool:
        chunks = self._chunks(target)
        if self.reducing:
            ok = all(matches_sum(chunks[c], srcs) for c, srcs in enumerate(self.layout.sources))
        else:
            ok = all(matches_pattern(chunks[c], *srcs[0]) for c, srcs in enumerate(self.layout.sources))
        return self.rig.all_true(ok)

    def fn(self, impl: str, group=None):
        if impl == "nccl":
            op = getattr(dist, self.coll.api_name)
            if self.coll.single_tensor:
                return lambda: op(self.out, group=group)
            return lambda: op(self.out, self.inp, group=group)
        if impl == "conccl":
            # As a loop over the same buffers runs it: a persistent op, agreed with the peers
            # once (the first time any strategy asks, on every rank alike), then only started.
            return self.conccl_op().start
        if impl == "torch_lc":
            name = dist.group.WORLD.group_name

            def run():
                out = torch.ops.symm_mem._low_contention_all_gather(self.lc_in, name)
                self.lc_out = torch.ops._c10d_functional.wait_tensor(out)
            return run
        raise ValueError(f"unknown collective implementation {impl!r}")

    def conccl_op(self):
        if self._conccl_op is None:
            tensors = (self.out,) if self.coll.single_tensor else (self.out, self.inp)
            self._conccl_op = getattr(conccl, "persistent_" + self.coll.api_name)(*tensors)
        return self._conccl_op

    def poison_lc(self) -> None:
        """PyTorch's op allocates its output every call: poison the last one and let it go, so
        the allocator's next block holds no correct bytes from before."""
        if self.lc_out is not None:
            self.poison(self.lc_out)
            self.lc_out = None

    def hbm_bytes(self) -> int:
        """Bytes this rank's HBM reads and writes in the collective (its peers' share arrives by
        NVLink and is written here; its own share is read once per peer)."""
        return self.coll.hbm_bytes(self.size, self.rig.world)


class GemmCase:
    def __init__(self, rig: Rig, gemm: Gemm):
        g = torch.Generator(device=rig.device).manual_seed(1234 + rig.rank)
        self.gemm = gemm
        self.a = torch.randn(gemm.m, gemm.k, dtype=torch.bfloat16, device=rig.device, generator=g)
        self.b = torch.randn(gemm.k, gemm.n, dtype=torch.bfloat16, device=rig.device, generator=g)
        self.c = torch.empty(gemm.m, gemm.n, dtype=torch.bfloat16, device=rig.device)

    def fn(self):
        return lambda: torch.mm(self.a, self.b, out=self.c)


# ----------------------------------------------------------------------------- the study

class Progress:
    """A one-line progress bar on rank 0 (a line per step when not on a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.monotonic()
        self.out, self.tty = sys.stderr, sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        n = 30 * self.done // max(1, self.total)
        el = time.monotonic() - self.t0
        line = f"[{'#' * n}{'.' * (30 - n)}] {self.done}/{self.total} {el:6.0f}s  {label}"
        print(("\r" + line.ljust(100)) if self.tty else line, end="" if self.tty else "\n", file=self.out, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=self.out)


def study_worker(rank: int, world: int, cfg: StudyConfig) -> StudyResults | None:
    """Runs in every rank's process. Rank 0 returns (and saves as it goes) the results."""
    rig = Rig(rank, world, cfg)
    need = required_bytes(cfg.scenarios, world, cfg.quick)
    if need > rig.memory:
        worst = max(cfg.scenarios, key=lambda s: s.memory_bytes(world))
        raise StudyError(f"the study needs {need / 2**30:.1f} GiB per GPU but the GPU has "
                         f"{rig.memory / 2**30:.1f} GiB; the largest scenario is {worst.id}")
    res = cfg.resume or StudyResults(kind="measured", meta=cfg.meta, config=RunConfig(
        quick=cfg.quick, warmup=cfg.warmup, iters=cfg.iters, world=world, side_by_side=cfg.side_by_side,
        min_timed_ms=cfg.min_timed_ms, max_iters=cfg.max_iters, auto_in_turns=cfg.auto_in_turns,
        conccl_call="persistent"))
    res.complete, res.error = False, None
    done = steps_done(res)
    save = (lambda: save_results(cfg.out_dir, res)) if rank == 0 else (lambda: None)
    gemms = list({s.gemm.tag: s.gemm for s in cfg.scenarios}.values())
    sizes = SIZE_SWEEP_QUICK if cfg.quick else SIZE_SWEEP
    ctas = CTA_SWEEP_QUICK if cfg.quick else CTA_SWEEP
    cta_sizes = CTA_SIZES_QUICK if cfg.quick else CTA_SIZES
    sm_loss = SM_LOSS_QUICK if cfg.quick else SM_LOSS
    colls = sorted({s.collective for s in cfg.scenarios})
    progress = Progress(2 + len(gemms) + len(colls) * 2 + len(cfg.scenarios), rank == 0)

    arena_out, arena_in = arena_bytes(cfg.scenarios, world, cfg.quick)
    arenas = (conccl.empty(arena_out, dtype=torch.uint8), conccl.empty(arena_in, dtype=torch.uint8))
    res.ncu = cfg.ncu
    if rig.plan_error:
        res.auto_skipped = rig.plan_error
    res.machine = Machine(device=torch.cuda.get_device_name(rig.device), sm_count=rig.sm_count,
                          memory_bytes=rig.memory, world=world)

    # Peak HBM bandwidth: a same-GPU copy reads and writes every byte.
    if "hbm" not in done:
        src = torch.empty(HBM_PROBE_BYTES, dtype=torch.uint8, device=rig.device)
        dst = torch.empty_like(src)
        probe = (src, dst)
        t = rig.timed([(rig.gemm_stream, lambda: probe[1].copy_(probe[0]))])
        res.peaks.hbm_bytes_per_s = 2 * HBM_PROBE_BYTES / (statistics.median(t) / 1e3)
        src = dst = probe = None
    progress.step("HBM bandwidth")

    # GEMMs alone, losing SMs to a green context holding the rest.
    for g in gemms:
        if ("gemm", g.tag) in done:
            progress.step(f"GEMM {g.tag} SM sweep (done before)")
            continue
        case = GemmCase(rig, g)
        for k in sm_loss:
            stream, granted = rig.green_stream(k)
            t = rig.timed([(stream, case.fn())])
            res.gemm_sm_loss.append(GemmSmLoss(gemm=g.tag, mnk=g.mnk, flops=g.flops, bytes=g.bytes(), sms_asked=k,
                                               sms_taken=rig.sm_count - granted, sms_granted=granted,
                                               time_ms=Timing.of(t)))
        del case
        torch.cuda.empty_cache()
        save()
        progress.step(f"GEMM {g.tag} SM sweep")
    analysis.set_gemm_peaks(res)

    # Collectives alone: over sizes (NCCL and conccl), and over the CTAs NCCL may use.
    for c in colls:
        if ("sizes", c) in done and ("ctas", c) in done:
            progress.step(f"{c} size sweep (done before)")
            progress.step(f"{c} CTA sweep (done before)")
            continue
        res.coll_sizes = [r for r in res.coll_sizes if r.collective != c]  # redo a half-done collective whole
        res.coll_ctas = [r for r in res.coll_ctas if r.collective != c]
        for size in sizes:
            case = CollectiveCase(rig, c, size, arenas)
            for impl in ("nccl", "conccl"):
                t = rig.timed([(rig.comm_stream, case.fn(impl))], poison=case.poison)
                res.coll_sizes.append(CollSize(collective=c, size=size, impl=impl, time_ms=Timing.of(t),
                                               correct=case.check(), hbm_bytes=case.hbm_bytes()))
        save()
        progress.step(f"{c} size sweep")
        for size in cta_sizes:
            case = CollectiveCase(rig, c, size, arenas)
            for k in (*ctas, None):
                t = rig.timed([(rig.comm_stream, case.fn("nccl", rig.nccl_group(ctas=k)))])
                res.coll_ctas.append(CollCtas(collective=c, size=size, impl="nccl", ctas=k, time_ms=Timing.of(t)))
            t = rig.timed([(rig.comm_stream, case.fn("conccl"))])
            res.coll_ctas.append(CollCtas(collective=c, size=size, impl="conccl", ctas=0, time_ms=Timing.of(t)))
        save()
        progress.step(f"{c} CTA sweep")
    analysis.set_comm_peaks(res)

    # Scenarios: isolated times, then every strategy.
    current = None
    for s in cfg.scenarios:
        if ("scenario", s.id) in done:
            progress.step(f"{s.id} (done before)")
            continue
        if current is None or current.gemm is not s.gemm:
            current = None
            torch.cuda.empty_cache()
            current = GemmCase(rig, s.gemm)
        res.scenarios.append(measure_scenario(rig, s, current, arenas))
        save()
        progress.step(s.id)
    progress.close()
    res.wall_s = time.monotonic() - progress.t0
    res.complete = True
    save()
    return res if rank == 0 else None


def steps_done(res: StudyResults) -> set:
    """The steps an interrupted run's results hold whole (each is saved once it is whole):
    "hbm", ("gemm", tag), ("sizes" | "ctas", collective), ("scenario", id)."""
    done = {("gemm", r.gemm) for r in res.gemm_sm_loss}
    done |= {("sizes", r.collective) for r in res.coll_sizes} | {("ctas", r.collective) for r in res.coll_ctas}
    done |= {("scenario", s.id) for s in res.scenarios}
    return done | ({"hbm"} if res.peaks.hbm_bytes_per_s else set())


def measure_scenario(rig: Rig, s: Scenario, gemm: GemmCase, arenas) -> ScenarioResult:
    """Every configuration of one scenario, timed side by side (``Rig.timed_side_by_side``):
    the GEMM alone, each collective alone, every strategy at every sweep point, and ``auto``."""
    size = s.size_for(rig.world)
    case = CollectiveCase(rig, s.collective, size, arenas)
    rec = ScenarioResult.new(s, size)
    rec.hbm_bytes = HbmBytes(gemm=s.gemm.bytes(), comm=case.hbm_bytes())
    configs, labels = [], []  # labels: how to file each result in rec

    def add(label, parts, poison=None, check=None):
        labels.append(label)
        configs.append((parts, poison, check))

    add(("gemm",), [(rig.gemm_stream, gemm.fn())])
    for impl in ("nccl", "conccl") + (("torch_lc",) if STRATEGIES["torch_lc"].runs(s.collective) else ()):
        add(("comm", impl), [(rig.comm_stream, case.fn(impl))])
    for strat in strategies_for(s.collective):
        if strat.impl == "auto":
            if rig.plan_error is None:
                parts, info = _auto_parts(rig, s, size, case, gemm)
                add(("auto", info), parts, case.poison, case.check)
            continue
        for k in strat.sweep(rig.cfg.quick):
            stream, granted = rig.green_stream(k if strat.partition else 0)
            group = rig.nccl_group(ctas=k if strat.partition == "nccl_ctas" else None,
                                   high_priority=strat.high_priority)
            comm = (rig.comm_stream, case.fn(strat.impl, group))
            work = (stream, gemm.fn())
            parts = [comm, work] if strat.comm_first else [work, comm]
            if strat.impl == "torch_lc":
                add(("run", strat.name, k if strat.partition else 0, granted), parts, case.poison_lc,
                    lambda: case.check(case.lc_out))
            else:
                add(("run", strat.name, k if strat.partition else 0, granted), parts, case.poison, case.check)
    if rig.cfg.side_by_side:
        results = rig.timed_side_by_side(configs)
    else:
        results = [(rig.timed(parts, poison), check() if check is not None else None) for parts, poison, check in configs]
    for label, (t, correct) in zip(labels, results):
        if label[0] == "gemm":
            rec.t_gemm = Timing.of(t)
        elif label[0] == "comm":
            rec.t_comm[label[1]] = Timing.of(t)
        elif label[0] == "auto":
            rec.runs["auto"] = [Run(**label[1], time_ms=Timing.of(t), correct=correct)]
        else:
            _, name, sms, granted = label
            rec.runs.setdefault(name, []).append(Run(sms=sms, gemm_sms=granted, time_ms=Timing.of(t), correct=correct))
    if rig.cfg.auto_in_turns and "auto" in rec.runs:
        rec.auto_in_turns = _auto_in_turns(rig, labels, configs, results)
    case.lc_out = None
    return rec


def _auto_in_turns(rig: Rig, labels, configs, results) -> AutoInTurns | None:
    """``auto`` and the fastest strategy the runtime could apply, timed again in turns.

    Back to back, a configuration's time depends on what ran just before it (the power
    controller's state): the same plan measured 0-10% apart as ``auto`` and as its strategy.
    In turns, both see the same conditions."""
    runs = [(results[i][0], i) for i, lb in enumerate(labels) if lb[0] == "run" and STRATEGIES[lb[1]].runtime_applies]
    auto = next((i for i, lb in enumerate(labels) if lb[0] == "auto"), None)
    if not runs or auto is None:
        return None
    best = min(runs, key=lambda r: statistics.median(r[0]))[1]
    (t_best, ok_best), (t_auto, ok_auto) = rig.timed_side_by_side([configs[best], configs[auto]])
    _, name, sms, _ = labels[best]
    return AutoInTurns(strategy=name, sms=sms, best_ms=Timing.of(t_best), auto_ms=Timing.of(t_auto),
                       correct=bool(ok_best and ok_auto))


def _auto_parts(rig: Rig, s: Scenario, size: int, case, gemm: GemmCase):
    """The planner's plan for this scenario, applied by the runtime (conccl.overlap's launch)."""
    g = s.gemm
    plan = runtime.get_plan((g.m, g.n, g.k), s.collective, size, rig.world, "auto", rig.cfg.plan_profile,
                            device_name=rig.device_name)
    compute = gemm.fn()
    parts = [(rig.comm_stream, lambda: runtime.launch(plan, compute, lambda impl, group: case.fn(impl, group)(),
                                                      parts=rig.partitions))]
    return parts, {"sms": plan.sms, "gemm_sms": rig.sm_count - plan.gemm_sms_taken, "plan": plan.strategy}


