"""Condense a measured study into the planner's hardware profile (``profile.json``).

The study knows its results; the planner knows only its profile. This module is where one
becomes the other: the GEMM efficiencies and SM-loss tables of the reference GEMMs, the
collectives' size sweeps and CTA tables, the strategies' measured overlap, and the
interference residuals fitted (:func:`conccl.planner.fit.fit_interference`) on the reference
GEMMs' scenarios.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from ..planner.fit import Observation, fit_interference
from ..planner.profile import HardwareProfile, ProfileError
from ..planner.timing import LATENCY_BOUND_MAX
from .results import ScenarioResult, StudyResults

# The suite's reference GEMMs: one compute-bound, one memory-bound on H200 (as the paper built
# its lookup tables from one GEMM of each kind). The profile's GEMM tables and the planner's
# interference fit come from them and their scenarios only; the planner is judged on the rest.
REFERENCE_GEMMS = ("mb1", "dec1")


def observation(s: ScenarioResult) -> Observation | None:
    """What the planner's fit reads of a scenario (None: not classified or not measured)."""
    if not s.gemm_class or not s.t_gemm:
        return None
    return Observation(gemm_class=s.gemm_class, collective=s.collective, size=s.size, gemm_bytes=s.gemm.bytes,
                       comm_bytes=s.hbm_bytes.comm if s.hbm_bytes else 0, t_gemm=s.t_gemm.median / 1e3,
                       t_comm={impl: t.median / 1e3 for impl, t in s.t_comm.items()},
                       runs={name: tuple((r.sms, r.gemm_sms, r.time_ms.median / 1e3) for r in runs)
                             for name, runs in s.runs.items()})


def _sweep(rows) -> dict:
    """impl -> collective -> [[size, seconds], ...] in increasing size: a profile's sweep table
    from the study's rows of one sweep (``coll_sizes``, ``eager_sizes``)."""
    table: dict = {}
    for r in sorted(rows, key=lambda r: r.size):
        table.setdefault(r.impl, {}).setdefault(r.collective, []).append([r.size, r.time_ms.median / 1e3])
    return table


def profile_from_study(res: StudyResults) -> HardwareProfile:
    """Condense measured, derived study results into a profile."""
    if res.kind != "measured":
        raise ProfileError("a profile must come from a measured study, not a prediction")
    peaks, world = res.peaks, res.machine.world
    tags = {s.gemm.tag for s in res.scenarios}
    refs = [t for t in REFERENCE_GEMMS if t in tags] or sorted(tags)
    ref_scenarios = [s for s in res.scenarios if s.gemm.tag in refs]
    eff: dict = {}
    for s in ref_scenarios:
        if s.gemm_class == "compute-bound":
            eff.setdefault(s.gemm_class, []).append(s.gemm_flops_per_s / peaks.bf16_flops)
        elif s.gemm_class == "memory-bound":
            eff.setdefault(s.gemm_class, []).append(s.gemm_hbm_bytes_per_s / peaks.hbm_bytes_per_s)
    colls = {impl: {c: {"latency_s": f.latency_s, "bus_bytes_per_s": f.bytes_per_s * (world - 1) / world}
                    for c, f in per.items()} for impl, per in peaks.collective_fits.items()}
    # torch_lc has no size sweep: its bandwidth from the scenarios' isolated times.
    lc = [s.size * (world - 1) / world / (s.t_comm["torch_lc"].median / 1e3)
          for s in res.scenarios if "torch_lc" in s.t_comm]
    if lc:
        # one table entry per collective it ran (its Strategy's collectives)
        colls["torch_lc"] = {c: {"latency_s": 0.0, "bus_bytes_per_s": statistics.median(lc)}
                             for c in {s.collective for s in res.scenarios if "torch_lc" in s.t_comm}}
    gemm_cls = {s.gemm.tag: s.gemm_class for s in ref_scenarios}
    loss: dict = {}
    for r in res.gemm_sm_loss:
        cls = gemm_cls.get(r.gemm)
        if cls and r.slowdown:
            loss.setdefault(cls, {}).setdefault(r.sms_taken, []).append(r.slowdown)
    cta: dict = {}
    for r in res.coll_ctas:
        if r.impl == "nccl" and r.ctas is not None and r.slowdown:
            band = "latency-bound" if r.size <= LATENCY_BOUND_MAX else "bandwidth-bound"
            cta.setdefault(r.collective, {}).setdefault(band, {})[r.ctas] = r.slowdown
    overlap: dict = {}
    for s in res.scenarios:
        for name, st in (s.strategies or {}).items():
            o = overlap.setdefault(name, {}).setdefault(s.collective, {})
            o.setdefault(s.taxonomy, []).append(st.pct_ideal)
            o.setdefault("all", []).append(st.pct_ideal)
    m = res.meta
    prof = HardwareProfile(
        device=res.machine.device, world=world, sm_count=res.machine.sm_count,
        memory_bytes=res.machine.memory_bytes, nvlinks=res.machine.nvlinks, bf16_flops=peaks.bf16_flops,
        hbm_bytes_per_s=peaks.hbm_bytes_per_s, nvlink_bytes_per_s=peaks.nvlink_bytes_per_s or 0.0,
        gemm_efficiency={c: statistics.median(v) for c, v in eff.items()}, collectives=colls,
        gemm_sm_loss={c: {k: statistics.median(v) for k, v in sorted(t.items())} for c, t in loss.items()},
        coll_cta_loss=cta,
        overlap={n: {c: {t: statistics.fmean(v) for t, v in per.items()} for c, per in cs.items()}
                 for n, cs in overlap.items()},
        comm_sweep=_sweep(res.coll_sizes), eager_sweep=_sweep(res.eager_sizes),
        source={"date": m.get("date"), "commit": m.get("commit"), "machine_kind": m.get("machine_kind"),
                "torch": m.get("torch"), "nccl": m.get("nccl"), "scenarios": len(res.scenarios),
                "reference_gemms": refs, "fit_scenarios": [s.id for s in ref_scenarios]},
    )
    fit_on = [o for s in ref_scenarios if (o := observation(s)) is not None]
    return replace(prof, interference=fit_interference(prof, fit_on))
