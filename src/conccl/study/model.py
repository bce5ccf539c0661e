"""The study without a GPU: the same document, modelled from a measured hardware profile.

- GEMM and collective times alone: the planner's (``conccl.planner.timing``): roofline with
  the profile's measured efficiencies; the measured size sweep, interpolated.
- SM-loss and CTA tables: the profile's, interpolated between measured points.
- Concurrent time of a strategy: the planner's model of that strategy (and for "auto", of the
  plan the planner picks); for an outside reference (torch_lc), the percent of ideal the profile
  measured for it, collective and taxonomy, applied to this scenario's ideal speedup. A fitted
  model, labelled a prediction everywhere.
"""
from __future__ import annotations

from .. import collectives
from ..planner import plan_auto, plan_strategy, timing, workload
from ..planner.profile import HardwareProfile
from ..strategy import strategies_for
from . import analysis, metrics
from .config import CTA_SIZES, CTA_SIZES_QUICK, CTA_SWEEP, CTA_SWEEP_QUICK, SIZE_SWEEP, SIZE_SWEEP_QUICK, SM_LOSS, SM_LOSS_QUICK
from .results import (CollCtas, CollSize, GemmSmLoss, HbmBytes, Machine, Peaks, Run, RunConfig, ScenarioResult,
                      StudyResults, Timing)
from .scenarios import Gemm, Scenario


def gemm_ms(p: HardwareProfile, g: Gemm) -> tuple[float, str]:
    t, cls = timing.gemm_time(p, timing.Workload(g.m, g.n, g.k, "all_gather", 1, p.world))
    return 1e3 * t, cls


def comm_ms(p: HardwareProfile, impl: str, collective: str, size: int, world: int) -> float | None:
    t = timing.comm_time(p, impl, collective, size, world)
    return None if t is None else 1e3 * t


def overlap_pct(p: HardwareProfile, strategy: str, collective: str, taxonomy: str) -> float | None:
    per = p.overlap.get(strategy, {}).get(collective, {})
    return per.get(taxonomy, per.get("all"))


def new_prediction(p: HardwareProfile, scenarios: list[Scenario], world: int, quick: bool, meta: dict) -> StudyResults:
    """A prediction's document with its isolated sweeps, before any scenario."""
    res = StudyResults(kind="prediction", meta=meta, config=RunConfig(quick=quick, warmup=0, iters=0, world=world),
                       machine=Machine(device=p.device, sm_count=p.sm_count, memory_bytes=p.memory_bytes, world=world),
                       peaks=Peaks(bf16_flops=p.bf16_flops, hbm_bytes_per_s=p.hbm_bytes_per_s,
                                   nvlink_bytes_per_s=p.nvlink_bytes_per_s))
    for g in {s.gemm.tag: s.gemm for s in scenarios}.values():
        t0, cls = gemm_ms(p, g)
        for k in SM_LOSS_QUICK if quick else SM_LOSS:
            slow = timing.gemm_sm_loss(p, cls, k)
            res.gemm_sm_loss.append(GemmSmLoss(gemm=g.tag, mnk=g.mnk, flops=g.flops, bytes=g.bytes(), sms_taken=k,
                                               sms_granted=p.sm_count - k, time_ms=Timing.point(t0 * slow)))
    colls = sorted({s.collective for s in scenarios})
    for c in colls:
        for size in SIZE_SWEEP_QUICK if quick else SIZE_SWEEP:
            for impl in ("nccl", "conccl"):
                t = comm_ms(p, impl, c, size, world)
                if t is not None:
                    res.coll_sizes.append(CollSize(collective=c, size=size, impl=impl, time_ms=Timing.point(t)))
        for size in CTA_SIZES_QUICK if quick else CTA_SIZES:
            base = comm_ms(p, "nccl", c, size, world)
            if base is None:
                continue
            for k in (*(CTA_SWEEP_QUICK if quick else CTA_SWEEP), None):
                slow = timing.comm_cta_loss(p, c, size, k)
                res.coll_ctas.append(CollCtas(collective=c, size=size, impl="nccl", ctas=k,
                                              time_ms=Timing.point(base * slow)))
    analysis.set_comm_peaks(res)
    res.peaks.nvlink_bytes_per_s = p.nvlink_bytes_per_s
    return res


def predict_scenario(p: HardwareProfile, s: Scenario, world: int, quick: bool) -> ScenarioResult:
    """One scenario's isolated and concurrent times, as the profile predicts them."""
    size = s.size_for(world)
    rec = ScenarioResult.new(s, size)
    tg, _ = gemm_ms(p, s.gemm)
    rec.t_gemm = Timing.point(tg)
    for impl in ("nccl", "conccl", "torch_lc"):
        t = comm_ms(p, impl, s.collective, size, world)
        if t is not None:
            rec.t_comm[impl] = Timing.point(t)
    tc = rec.t_comm["nccl"].median
    rec.hbm_bytes = HbmBytes(gemm=s.gemm.bytes(), comm=collectives.get(s.collective).hbm_bytes(size, world))
    ideal, tax = metrics.ideal_speedup(tg, tc), metrics.taxonomy(tg, tc)
    w = workload((s.gemm.m, s.gemm.n, s.gemm.k), s.collective, size, world)
    for strat in strategies_for(s.collective):
        if strat.impl in ("nccl", "conccl", "auto"):
            plans = ([plan_auto(p, w)] if strat.impl == "auto" else
                     [plan_strategy(p, w, strat.name, k if strat.partition else None)
                      for k in strat.sweep(quick)])
            rec.runs[strat.name] = [Run(sms=pl.sms, gemm_sms=p.sm_count - pl.gemm_sms_taken, plan=pl.strategy,
                                        time_ms=Timing.point(1e3 * pl.predicted["concurrent_s"]), correct=None)
                                    for pl in plans]
            continue
        pct = overlap_pct(p, strat.name, s.collective, tax)  # outside references: the measured mean
        if pct is None:
            continue
        sp = 1 + pct / 100 * (ideal - 1)
        rec.runs[strat.name] = [Run(sms=0, gemm_sms=None, time_ms=Timing.point((tg + tc) / sp), correct=None)]
    return rec


def predict(p: HardwareProfile, scenarios: list[Scenario], world: int, quick: bool, meta: dict,
            res: StudyResults | None = None, save=None) -> StudyResults:
    """The whole prediction. ``res``: an interrupted one to continue (its scenarios are kept);
    ``save()`` runs after every scenario, so a Ctrl-C keeps what was predicted."""
    res = res or new_prediction(p, scenarios, world, quick, meta)
    done = {s.id for s in res.scenarios}
    for s in scenarios:
        if s.id not in done:
            res.scenarios.append(predict_scenario(p, s, world, quick))
            if save:
                save()
    res.complete = True
    return res
