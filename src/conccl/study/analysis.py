"""Everything a study derives from its raw times (:mod:`conccl.study.results` holds the records).

:func:`derive` adds the classes, ideal speedups, taxonomy, speedups and percent of ideal, the
per-strategy summary and the paper's claims beside this machine's. Pure functions of the
results: the report can be rebuilt from ``results.json``.
"""
from __future__ import annotations

import statistics

from ..collectives.all_gather import ALL_GATHER
from ..collectives.all_to_all import ALL_TO_ALL
from ..strategy import PAPER_STRATEGIES, STRATEGIES
from . import metrics
from .results import (Claim, CommFit, GroupSummary, ScenarioResult, StrategyResult, StrategySummary,
                      StudyResults, Summary)

GOAL_MEAN, GOAL_EACH = 90.0, 80.0  # the project's goal for the best strategy, percent of ideal
BEST_ALONE = ("nccl", "conccl")  # efficiency's t_comm_best: the faster of these alone


def _impl(strategy: str) -> str:
    """The collective implementation a strategy runs (an unknown name: NCCL's, the baseline)."""
    s = STRATEGIES.get(strategy)
    return s.impl if s is not None else "nccl"


def set_gemm_peaks(res: StudyResults) -> None:
    """bf16 matrix peak: the best rate any GEMM of the study reached on all SMs."""
    rates = [r.flops / (r.time_ms.median / 1e3) for r in res.gemm_sm_loss if r.sms_taken == 0]
    if rates:
        res.peaks.bf16_flops = max(rates)


def set_comm_peaks(res: StudyResults) -> None:
    """NVLink: the best bus bandwidth a copy-engine collective reached (per GPU, one direction);
    latency and bandwidth fits per (implementation, collective) over the size sweep."""
    world = res.world
    fits: dict = {}
    for impl in sorted({r.impl for r in res.coll_sizes}):
        for c in sorted({r.collective for r in res.coll_sizes}):
            rows = [r for r in res.coll_sizes if r.impl == impl and r.collective == c]
            if len(rows) >= 2:
                lat, bw = metrics.fit_latency_bandwidth([r.size for r in rows], [r.time_ms.median / 1e3 for r in rows])
                fits.setdefault(impl, {})[c] = CommFit(lat, bw)
    res.peaks.collective_fits = fits
    bus = [r.size * (world - 1) / world / (r.time_ms.median / 1e3) for r in res.coll_sizes if r.impl == "conccl"]
    if bus:
        res.peaks.nvlink_bytes_per_s = max(bus)


def _comm_class(res: StudyResults, collective: str, size: int) -> str | None:
    fit = res.peaks.collective_fits.get("nccl", {}).get(collective)
    return metrics.comm_class(size, fit.latency_s, fit.bytes_per_s) if fit else None


def derive(res: StudyResults) -> StudyResults:
    """Fill every derived field in place and return ``res``."""
    peaks = res.peaks
    if peaks.bf16_flops and peaks.hbm_bytes_per_s:
        peaks.op_to_byte = peaks.bf16_flops / peaks.hbm_bytes_per_s
    for r in res.gemm_sm_loss:
        base = next((b for b in res.gemm_sm_loss if b.gemm == r.gemm and b.sms_taken == 0), None)
        r.slowdown = r.time_ms.median / base.time_ms.median if base else None
    for r in res.coll_ctas:
        full = next((b for b in res.coll_ctas if b.collective == r.collective and b.size == r.size
                     and b.impl == "nccl" and b.ctas is None), None)
        r.slowdown = r.time_ms.median / full.time_ms.median if full else None
    for r in res.copy_beside_gemm:
        r.efficiency = 100 * max(r.gemm_ms.median, r.copy_ms.median) / r.together_ms.median
    for s in res.scenarios:
        _derive_scenario(res, s)
    res.summary = summarize(res.scenarios)
    # an eager call whose output differed from NCCL's (the eager sweep) is a wrong result too
    res.summary.wrong += sorted({f"eager:{r.collective}:{r.size}" for r in res.eager_sizes if r.correct is False})
    res.claims = claims(res)
    return res


def _derive_scenario(res: StudyResults, s: ScenarioResult) -> None:
    peaks = res.peaks
    tg = s.t_gemm.median / 1e3
    g = s.gemm
    s.gemm_op_to_byte = g.flops / g.bytes
    s.gemm_flops_per_s = g.flops / tg
    s.gemm_hbm_bytes_per_s = g.bytes / tg
    counters = res.ncu.get(g.tag)
    if counters and counters.get("dram_bytes"):
        # The paper's definition: measured op-to-byte (flops / DRAM bytes) against the machine's.
        s.gemm_dram_bytes, s.gemm_l2_bytes = counters["dram_bytes"], counters["l2_bytes"]
        s.gemm_measured_op_to_byte = g.flops / counters["dram_bytes"]
        s.gemm_hbm_bytes_per_s = counters["dram_bytes"] / tg
    if counters and counters.get("dram_bytes") and peaks.op_to_byte:
        s.gemm_class = ("compute-bound" if s.gemm_measured_op_to_byte > peaks.op_to_byte else "memory-bound")
        s.gemm_class_by = "ncu DRAM bytes: measured op-to-byte vs the machine's"
    elif peaks.bf16_flops and peaks.hbm_bytes_per_s:
        s.gemm_class = metrics.gemm_class(g.flops, g.bytes, tg, peaks.bf16_flops, peaks.hbm_bytes_per_s)
        s.gemm_class_by = "achieved rate: nearer roof (compulsory bytes)"
    s.comm_class = _comm_class(res, s.collective, s.size)
    nccl = s.t_comm.get("nccl")
    if not nccl:
        return
    tc = nccl.median
    comm_bytes = s.hbm_bytes.comm if s.hbm_bytes else 0
    s.comm_hbm_bytes_per_s = {impl: comm_bytes / (t.median / 1e3) for impl, t in s.t_comm.items()}
    s.ideal = metrics.ideal_speedup(s.t_gemm.median, tc)
    s.taxonomy = metrics.taxonomy(s.t_gemm.median, tc)
    s.t_comm_best = min(t.median for impl, t in s.t_comm.items() if impl in BEST_ALONE)
    s.strategies = {}
    for name, runs in s.runs.items():
        if not runs:
            continue
        for r in runs:
            r.speedup = metrics.speedup(s.t_gemm.median, tc, r.time_ms.median)
            r.pct_ideal = metrics.percent_of_ideal(r.speedup, s.ideal)
            r.efficiency = metrics.efficiency(s.t_gemm.median, s.t_comm_best, r.time_ms.median)
            # Overlap judged against the collective this run used, timed alone (auto: the
            # strategy it picked): a collective faster than NCCL lifts speedup past the
            # NCCL-based ideal; this says how well it overlapped.
            own = s.t_comm.get(_impl(r.plan or name), nccl).median
            r.pct_own_ideal = metrics.percent_of_ideal(metrics.speedup(s.t_gemm.median, own, r.time_ms.median),
                                                       metrics.ideal_speedup(s.t_gemm.median, own))
        # One number per (scenario, strategy), read by every table: its fastest sweep point.
        best = min(runs, key=lambda r: r.time_ms.median)
        s.strategies[name] = StrategyResult(
            time_ms=best.time_ms, speedup=best.speedup, pct_ideal=best.pct_ideal, pct_own_ideal=best.pct_own_ideal,
            sms=best.sms, gemm_sms=best.gemm_sms, efficiency=best.efficiency,
            correct=None if any(r.correct is None for r in runs) else all(r.correct for r in runs))
    paper = [n for n in PAPER_STRATEGIES if n in s.strategies]
    c3 = [n for n in paper if n.startswith("c3_")]
    if c3:
        s.c3_best = max(c3, key=lambda n: s.strategies[n].efficiency)
    if paper:
        s.best = max(paper, key=lambda n: s.strategies[n].efficiency)


def summarize(scenarios: list[ScenarioResult]) -> Summary:
    """Per strategy: mean / min percent of ideal and mean speedup over the scenarios that ran it;
    the same per (collective, taxonomy) group, with the mean ideal speedup."""
    done = [s for s in scenarios if s.strategies is not None]
    names = [n for n in STRATEGIES if any(n in s.strategies for s in done)]
    names += ["c3_best", "best"]

    def value(s, n, key):
        if n in ("c3_best", "best"):
            pick = getattr(s, n)
            return getattr(s.strategies[pick], key) if pick is not None else None
        return getattr(s.strategies[n], key) if n in s.strategies else None

    per = {}
    for n in names:
        pct = [v for s in done if (v := value(s, n, "pct_ideal")) is not None]
        spd = [v for s in done if (v := value(s, n, "speedup")) is not None]
        own = [v for s in done if (v := value(s, n, "pct_own_ideal")) is not None]
        eff = [v for s in done if (v := value(s, n, "efficiency")) is not None]
        if pct:
            per[n] = StrategySummary(mean_pct_ideal=statistics.fmean(pct), min_pct_ideal=min(pct),
                                     mean_pct_own_ideal=statistics.fmean(own) if own else None,
                                     mean_speedup=statistics.fmean(spd), n=len(pct),
                                     n_at_least_80=sum(p >= GOAL_EACH for p in pct),
                                     mean_efficiency=statistics.fmean(eff), min_efficiency=min(eff))
    groups: dict = {}
    for s in done:
        groups.setdefault(f"{s.collective} / {s.taxonomy}", []).append(s)
    by_group = {}
    for key, ss in sorted(groups.items()):
        by_group[key] = GroupSummary(
            n=len(ss), ideal=statistics.fmean(s.ideal for s in ss),
            speedup={n: statistics.fmean(v) for n in names
                     if (v := [x for s in ss if (x := value(s, n, "speedup")) is not None])},
            pct_ideal={n: statistics.fmean(v) for n in names
                       if (v := [x for s in ss if (x := value(s, n, "pct_ideal")) is not None])},
            efficiency={n: statistics.fmean(v) for n in names
                        if (v := [x for s in ss if (x := value(s, n, "efficiency")) is not None])})
    wrong = sorted(f"{s.id}:{n}" for s in done for n, r in s.strategies.items() if r.correct is False)
    return Summary(strategies=per, groups=by_group, n_scenarios=len(done), wrong=wrong,
                   ideal_mean=statistics.fmean(s.ideal for s in done) if done else None)


def _mean_pct(res: StudyResults, name: str, collective: str | None = None) -> float | None:
    vals = [s.strategies[name].pct_ideal for s in res.scenarios
            if s.strategies and name in s.strategies and (collective is None or s.collective == collective)]
    return statistics.fmean(vals) if vals else None


def claims(res: StudyResults) -> list[Claim]:
    """The paper's claims, each beside what this run shows (None where it could not be measured)."""
    per = res.summary.strategies if res.summary else {}
    pct = {n: per[n].mean_pct_ideal if n in per else None for n in (*PAPER_STRATEGIES, "c3_best", "best")}

    def fmt(v):
        return None if v is None else round(v, 1)

    rows = [
        {"claim": "c3_base (GEMM first) reaches ~21% of ideal on average", "paper": "21%", "value": fmt(pct["c3_base"]),
         "unit": "% of ideal"},
        {"claim": "schedule prioritization (c3_sp) reaches ~42%", "paper": "42%", "value": fmt(pct["c3_sp"]),
         "unit": "% of ideal"},
        {"claim": "resource partitioning (c3_rp) about equals c3_sp", "paper": "41% vs 42%",
         "value": fmt(None if None in (pct["c3_rp"], pct["c3_sp"]) else pct["c3_rp"] - pct["c3_sp"]),
         "unit": "points (c3_rp - c3_sp)",
         "holds": None if None in (pct["c3_rp"], pct["c3_sp"]) else abs(pct["c3_rp"] - pct["c3_sp"]) <= 5},
        {"claim": "c3_sp_rp is no better than c3_sp", "paper": "no better",
         "value": fmt(None if None in (pct["c3_sp_rp"], pct["c3_sp"]) else pct["c3_sp_rp"] - pct["c3_sp"]),
         "unit": "points (c3_sp_rp - c3_sp)",
         "holds": None if None in (pct["c3_sp_rp"], pct["c3_sp"]) else pct["c3_sp_rp"] - pct["c3_sp"] <= 5},
        {"claim": "best of the c3 strategies (c3_best) reaches ~48%", "paper": "48%", "value": fmt(pct["c3_best"]),
         "unit": "% of ideal"},
        {"claim": "DMA collectives (conccl) reach ~66%", "paper": "66%", "value": fmt(pct["conccl"]),
         "unit": "% of ideal"},
        {"claim": "DMA collectives with SMs taken from memory-bound GEMMs (conccl_rp) reach ~72%", "paper": "72%",
         "value": fmt(pct["conccl_rp"]), "unit": "% of ideal"},
    ]
    # Isolated: copy engines on par with SM collectives above 32 MB, slower below.
    ratios = {}
    for r in res.coll_sizes:
        if r.impl != "conccl":
            continue
        n = next((x for x in res.coll_sizes if x.impl == "nccl" and x.collective == r.collective
                  and x.size == r.size), None)
        if n:
            ratios.setdefault(r.size > 32 << 20, []).append(r.time_ms.median / n.time_ms.median)
    big, small = ratios.get(True), ratios.get(False)
    rows.append({"claim": "DMA collectives on par with SM ones above 32 MB", "paper": "on par",
                 "value": fmt(statistics.fmean(big)) if big else None, "unit": "x NCCL's time, mean over sizes > 32 MB",
                 "holds": None if not big else statistics.fmean(big) <= 1.1})
    rows.append({"claim": "DMA collectives slower below 32 MB (up to 4x)", "paper": "up to 4x slower",
                 "value": fmt(max(small)) if small else None, "unit": "x NCCL's time, worst size <= 32 MB",
                 "holds": None if not small else max(small) > 1.0})
    # Two claims compare the paper's two collectives.
    ag, a2a = ALL_GATHER.name, ALL_TO_ALL.name
    gain = {c: None if None in (_mean_pct(res, "conccl", c), _mean_pct(res, "c3_base", c))
            else _mean_pct(res, "conccl", c) - _mean_pct(res, "c3_base", c) for c in (ag, a2a)}
    rows.append({"claim": "all-to-all gains more from DMA offload than all-gather", "paper": "yes (1.05x -> 1.43x)",
                 "value": None if None in gain.values() else fmt(gain[a2a] - gain[ag]),
                 "unit": "points (a2a gain - ag gain, conccl vs c3_base)",
                 "holds": None if None in gain.values() else gain[a2a] > gain[ag]})
    base = {c: _mean_pct(res, "c3_base", c) for c in (ag, a2a)}
    rows.append({"claim": "under c3_base all-gather overlaps better than all-to-all", "paper": "24-46% vs 0-13%",
                 "value": None if None in base.values() else fmt(base[ag] - base[a2a]),
                 "unit": "points (ag - a2a)",
                 "holds": None if None in base.values() else base[ag] > base[a2a]})
    # Never a mean percent of ideal alone: the same strategy's mean efficiency beside it.
    for r, name in zip(rows, ("c3_base", "c3_sp", None, None, "c3_best", "conccl", "conccl_rp")):
        if name in per and per[name].mean_efficiency is not None:
            r["efficiency"] = round(per[name].mean_efficiency, 1)
    return [Claim(**r) for r in rows]
