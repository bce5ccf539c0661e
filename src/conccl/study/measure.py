"""The measured study: one process per GPU, every number as the paper took it
(:mod:`conccl.study.rig` times, :mod:`conccl.study.cases` runs and checks).

:func:`study_worker` runs the steps in order: peak HBM bandwidth, each GEMM losing SMs, each
collective alone over sizes and over NCCL's CTAs, every scenario with every strategy, then
every public collective called eagerly on ordinary tensors over sizes (the eager sweep).
Rank 0 records the numbers as :class:`~conccl.study.results.StudyResults` and saves them after
every step, so an interrupted run keeps what it measured, and a resumed one skips the steps
it holds (:func:`steps_done`).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import conccl

from .. import api, runtime
from ..planner import shipped
from ..strategy import STRATEGIES, strategies_for
from . import analysis
from .cases import EAGER_COLLECTIVES, EAGER_IMPLS, CollectiveCase, EagerCase, GemmCase
from .config import (CTA_SIZES, CTA_SIZES_QUICK, CTA_SWEEP, CTA_SWEEP_QUICK, EAGER_CALLS, SM_LOSS, SM_LOSS_QUICK,
                     StudyConfig, StudyError, arena_plan, eager_sizes, scenario_bytes, sweep_sizes)
from .progress import Progress
from .results import (AutoInTurns, CollCtas, CopyBesideGemm, CollSize, GemmSmLoss, HbmBytes, Machine, Run, RunConfig, ScenarioResult,
                      StudyResults, Timing, save_results)
from .rig import Rig
from .scenarios import Scenario

HBM_PROBE_BYTES = 2 << 30


def study_worker(rank: int, world: int, cfg: StudyConfig) -> StudyResults | None:
    """Runs in every rank's process. Rank 0 returns (and saves as it goes) the results."""
    rig = Rig(rank, world, cfg)
    _check_memory(rig, cfg)
    study = _MeasuredStudy(rig, cfg)
    study.hbm_bandwidth()
    study.gemm_sm_sweeps()
    analysis.set_gemm_peaks(study.res)
    study.collective_sweeps()
    analysis.set_comm_peaks(study.res)
    study.scenarios()
    study.eager_sweeps()
    study.finish()
    return study.res if rank == 0 else None


def _check_memory(rig: Rig, cfg: StudyConfig) -> None:
    """The parent judged the scenarios against ``cfg.memory_bytes``; refuse a rank whose GPU is smaller."""
    need = max(scenario_bytes(s, rig.world) for s in cfg.scenarios)
    if need > rig.memory:
        worst = max(cfg.scenarios, key=lambda s: scenario_bytes(s, rig.world))
        raise StudyError(f"the study needs {need / 2**30:.1f} GiB per GPU but GPU {rig.device} has "
                         f"{rig.memory / 2**30:.1f} GiB; the largest scenario is {worst.id}")


class _MeasuredStudy:
    """One rank's run of the study: its results so far, the steps they hold, and the symmetric
    arenas every collective case takes its buffers from. Each step is skipped where the
    results hold it whole and saved (rank 0) once done."""

    def __init__(self, rig: Rig, cfg: StudyConfig, steps: int | None = None):
        self.rig, self.cfg = rig, cfg
        world = rig.world
        self.res = res = cfg.resume or StudyResults(kind="measured", meta=cfg.meta, config=RunConfig(
            quick=cfg.quick, warmup=cfg.warmup, iters=cfg.iters, world=world, side_by_side=cfg.side_by_side,
            min_timed_ms=cfg.min_timed_ms, max_iters=cfg.max_iters, auto_in_turns=cfg.auto_in_turns,
            conccl_call="persistent"))
        res.complete, res.error = False, None
        self.done = steps_done(res)
        self.gemms = list({s.gemm.tag: s.gemm for s in cfg.scenarios}.values())
        self.colls = sorted({s.collective for s in cfg.scenarios})
        self.progress = Progress(steps or 2 + len(self.gemms) + len(self.colls) * 2 + len(EAGER_COLLECTIVES)
                                 + len(cfg.scenarios), rig.rank == 0)
        memory = cfg.memory_bytes or rig.memory
        self.sweep_sizes = sweep_sizes(cfg.quick, memory)
        self.sweep_arenas, self.arena_sizes = arena_plan(cfg.scenarios, world, cfg.quick, memory)
        self.arenas = None  # allocated where the collectives first need them
        res.ncu = cfg.ncu
        res.skipped = list(cfg.skipped)
        if rig.plan_error:
            res.auto_skipped = rig.plan_error
        elif rig.plan_choice is not None:
            res.meta = dict(res.meta, auto_profile=rig.plan_choice.note)
        res.machine = Machine(device=torch.cuda.get_device_name(rig.device), sm_count=rig.sm_count,
                              memory_bytes=rig.memory, world=world, nvlinks=shipped.local_nvlinks(rig.device.index) or 0)

    def _hold_arenas(self, sizes: tuple[int, int] | None) -> None:
        """Hold symmetric arenas of ``sizes`` (output, input) bytes (None: none): the ones held
        if they are those sizes, else released first (every rank at the same point: the plan is
        a pure function of the inputs), then allocated."""
        if self.arenas is not None and sizes is not None and tuple(a.numel() for a in self.arenas) == tuple(sizes):
            return
        if self.arenas is not None:
            torch.cuda.synchronize()
            self.rig.dist.barrier()  # no peer still copies from or into them
            for a in self.arenas:
                api.release(a)
            self.arenas = a = None
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            self.rig.dist.barrier()  # every peer has unmapped them too: their memory is free
        if sizes is None:
            return
        self.arenas = tuple(conccl.empty(n, dtype=torch.uint8) for n in sizes)
        if self.rig.rank == 0:
            free, _ = torch.cuda.mem_get_info(self.rig.device)
            print(f"# arenas: {sizes[0] / 2**30:.2f} + {sizes[1] / 2**30:.2f} GiB held, {free / 2**30:.1f} GiB free",
                  file=sys.stderr, flush=True)

    def save(self) -> None:
        if self.rig.rank == 0:
            save_results(self.cfg.out_dir, self.res)

    def hbm_bandwidth(self) -> None:
        """Peak HBM bandwidth: a same-GPU copy reads and writes every byte."""
        rig, res = self.rig, self.res
        if "hbm" not in self.done:
            src = torch.empty(HBM_PROBE_BYTES, dtype=torch.uint8, device=rig.device)
            dst = torch.empty_like(src)
            probe = (src, dst)
            t = rig.timed([(rig.gemm_stream, lambda: probe[1].copy_(probe[0]))])
            res.peaks.hbm_bytes_per_s = 2 * HBM_PROBE_BYTES / (statistics.median(t) / 1e3)
            src = dst = probe = None
        self.progress.step("HBM bandwidth")

    def gemm_sm_sweeps(self) -> None:
        """GEMMs alone, losing SMs to a green context holding the rest."""
        rig, res = self.rig, self.res
        sm_loss = SM_LOSS_QUICK if self.cfg.quick else SM_LOSS
        for g in self.gemms:
            if ("gemm", g.tag) in self.done:
                self.progress.step(f"GEMM {g.tag} SM sweep (done before)")
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
            self.save()
            self.progress.step(f"GEMM {g.tag} SM sweep")

    def copy_beside_gemm(self, d2d_bytes: int = 1 << 30, h2d_bytes: int = 256 << 20) -> None:
        """One GPU: every GEMM beside a copy-engine copy, alone and together (two streams): a
        same-GPU copy (it loads HBM at ~4x an NVLink transfer's rate, so it over-states what a
        collective costs the GEMM) and a pinned host-to-GPU copy over PCIe (a light load)."""
        rig = self.rig
        src = torch.empty(d2d_bytes, dtype=torch.uint8, device=rig.device)
        dst = torch.empty_like(src)
        host = torch.empty(h2d_bytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(h2d_bytes, dtype=torch.uint8, device=rig.device)
        copies = {"d2d": (d2d_bytes, lambda: dst.copy_(src, non_blocking=True)),
                  "h2d": (h2d_bytes, lambda: dev.copy_(host, non_blocking=True))}
        for g in self.gemms:
            case = GemmCase(rig, g)
            gemm = (rig.gemm_stream, case.fn())
            t_gemm = Timing.of(rig.timed([gemm]))
            for kind, (nbytes, fn) in copies.items():
                copy = (rig.comm_stream, fn)
                self.res.copy_beside_gemm.append(CopyBesideGemm(
                    gemm=g.tag, mnk=g.mnk, kind=kind, copy_bytes=nbytes, gemm_ms=t_gemm,
                    copy_ms=Timing.of(rig.timed([copy])), together_ms=Timing.of(rig.timed([gemm, copy]))))
            del case
            torch.cuda.empty_cache()
            self.progress.step(f"GEMM {g.tag} beside copies")

    def collective_sweeps(self) -> None:
        """Collectives alone: over sizes (NCCL and conccl), and over the CTAs NCCL may use."""
        res, progress = self.res, self.progress
        self._hold_arenas(self.sweep_arenas)
        for c in self.colls:
            if ("sizes", c) in self.done and ("ctas", c) in self.done:
                progress.step(f"{c} size sweep (done before)")
                progress.step(f"{c} CTA sweep (done before)")
                continue
            res.coll_sizes = [r for r in res.coll_sizes if r.collective != c]  # redo a half-done collective whole
            res.coll_ctas = [r for r in res.coll_ctas if r.collective != c]
            self._size_sweep(c)
            self.save()
            progress.step(f"{c} size sweep")
            self._cta_sweep(c)
            self.save()
            progress.step(f"{c} CTA sweep")

    def eager_sweeps(self) -> None:
        """Every public collective called eagerly over sizes (:meth:`_eager_sweep`). Last, with
        the arenas let go: its plain tensors and the staging workspace they grow (the
        reductions': world x the size) then take nothing from a scenario."""
        res, progress = self.res, self.progress
        self._hold_arenas(None)
        torch.cuda.empty_cache()
        for c in EAGER_COLLECTIVES:
            if ("eager", c) in self.done:
                progress.step(f"{c} eager sweep (done before)")
                continue
            res.eager_sizes = [r for r in res.eager_sizes if r.collective != c]
            self._eager_sweep(c)
            self.save()
            progress.step(f"{c} eager sweep")

    def _size_sweep(self, c: str) -> None:
        rig = self.rig
        for size in self.sweep_sizes:
            case = CollectiveCase(rig, c, size, self.arenas)
            for impl in ("nccl", "conccl"):
                t = rig.timed([(rig.comm_stream, case.fn(impl))], poison=case.poison)
                self.res.coll_sizes.append(CollSize(collective=c, size=size, impl=impl, time_ms=Timing.of(t),
                                                    correct=case.check(), hbm_bytes=case.hbm_bytes()))
            case.close()

    def _eager_sweep(self, c: str) -> None:
        """The public functions called eagerly on ordinary tensors, conccl's and
        torch.distributed's in turns, ``EAGER_CALLS`` back to back per execution: each call's
        time with its host part in it, which the persistent ops of the size sweep leave out
        (conccl's eager host time is several times NCCL's). What
        ``set_eager_path("auto")`` plans from (conccl.planner.eager), for every public
        collective: the reductions too, which the scenarios and the size sweep leave out."""
        rig = self.rig
        for size in eager_sizes(self.sweep_sizes):
            case = EagerCase(rig, c, size, EAGER_CALLS)
            correct = case.check()
            timed = rig.timed_side_by_side([([(rig.comm_stream, case.fn(impl))], None, None) for impl in EAGER_IMPLS])
            for impl, (ms, _) in zip(EAGER_IMPLS, timed):
                self.res.eager_sizes.append(CollSize(collective=c, size=size, impl=impl, correct=correct,
                                                     time_ms=Timing.of([t / EAGER_CALLS for t in ms])))
            del case
            torch.cuda.empty_cache()

    def _cta_sweep(self, c: str) -> None:
        rig, res = self.rig, self.res
        ctas = CTA_SWEEP_QUICK if self.cfg.quick else CTA_SWEEP
        for size in [s for s in (CTA_SIZES_QUICK if self.cfg.quick else CTA_SIZES) if s <= max(self.sweep_sizes)]:
            case = CollectiveCase(rig, c, size, self.arenas)
            for k in (*ctas, None):
                t = rig.timed([(rig.comm_stream, case.fn("nccl", rig.nccl_group(ctas=k)))])
                res.coll_ctas.append(CollCtas(collective=c, size=size, impl="nccl", ctas=k, time_ms=Timing.of(t)))
            t = rig.timed([(rig.comm_stream, case.fn("conccl"))])
            res.coll_ctas.append(CollCtas(collective=c, size=size, impl="conccl", ctas=0, time_ms=Timing.of(t)))
            case.close()

    def scenarios(self) -> None:
        """Scenarios: isolated times, then every strategy (:func:`measure_scenario`)."""
        current = None
        for s, arenas in zip(self.cfg.scenarios, self.arena_sizes):
            if ("scenario", s.id) in self.done:
                self.progress.step(f"{s.id} (done before)")
                continue
            if current is None or current.gemm is not s.gemm:
                current = None
                torch.cuda.empty_cache()
            self._hold_arenas(arenas)  # before the GEMM's operands: a release frees the most then
            if current is None:
                current = GemmCase(self.rig, s.gemm)
            self.res.scenarios.append(measure_scenario(self.rig, s, current, self.arenas))
            self.save()
            self.progress.step(s.id)

    def finish(self) -> None:
        self.progress.close()
        self.res.wall_s = time.monotonic() - self.progress.t0
        self.res.complete = True
        self.save()


def steps_done(res: StudyResults) -> set:
    """The steps an interrupted run's results hold whole (each is saved once it is whole):
    "hbm", ("gemm", tag), ("sizes" | "ctas" | "eager", collective), ("scenario", id)."""
    done = {("gemm", r.gemm) for r in res.gemm_sm_loss}
    done |= {("sizes", r.collective) for r in res.coll_sizes} | {("ctas", r.collective) for r in res.coll_ctas}
    done |= {("eager", r.collective) for r in res.eager_sizes}
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
    case.close()  # the arenas may be released before the next scenario
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


