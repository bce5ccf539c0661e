"""Fit the profile's interference residuals on measured scenarios (the reference GEMMs').

For each pairing and GEMM class, the (gemm, comm) slowdowns that, put into
:func:`conccl.planner.timing.concurrent_time` with the scenario's measured isolated times,
best reproduce the measured concurrent times (least squares on log time, grid search).
"""
from __future__ import annotations

import math

from ..profile import HardwareProfile
from . import timing

# Residual slowdowns tried: fine steps near 1, coarse up to "effectively serial".
GRID = tuple(round(0.8 + 0.02 * i, 2) for i in range(61)) + (2.5, 3.0, 4.0, 6.0, 10.0, 30.0, 100.0)
DELAYS = tuple(1e-6 * d for d in (0, 5, 10, 15, 20, 30, 40))  # a GEMM launched behind an NCCL call
FAMILY_RUNS = {"ce": ("conccl",), "sm": ("c3_sp",), "base": ("c3_base",), "rp": ("c3_rp",), "rp_first": ("c3_sp_rp",)}
COMM_FIRST = ("sm", "rp_first")


def _samples(p: HardwareProfile, scenarios: list[dict], family: str) -> dict:
    """class -> [(kwargs for concurrent_time, measured seconds)]."""
    out: dict = {}
    for s in scenarios:
        cls = s.get("gemm_class")
        if not cls or not s.get("t_gemm"):
            continue
        tg = s["t_gemm"]["median"] / 1e3
        for name in FAMILY_RUNS[family]:
            impl = "conccl" if family == "ce" else "nccl"
            if name not in s.get("runs", {}) or impl not in s["t_comm"]:
                continue
            tc = s["t_comm"][impl]["median"] / 1e3
            for r in s["runs"][name]:
                kw = {"family": family, "cls": cls, "t_gemm": tg, "t_comm": tc, "gemm_bytes": s["gemm"]["bytes"],
                      "comm_bytes": s.get("hbm_bytes", {}).get("comm", 0)}
                if family in ("rp", "rp_first"):
                    taken = p.sm_count - r["gemm_sms"] if r.get("gemm_sms") else r["sms"]
                    kw.update(gemm_sms_taken=taken, partitioned=True,
                              comm_loss=timing.comm_cta_loss(p, s["collective"], s["size"], r["sms"]))
                elif family == "sm":
                    kw.update(comm_sms=timing.default_ctas(p, s["collective"], s["size"]))
                out.setdefault(cls, []).append((kw, r["time_ms"]["median"] / 1e3))
    return out


def _fit(p: HardwareProfile, samples: list, delays=(0.0,)) -> dict:
    best = None
    for d in delays:
        for rg in GRID:
            for rc in (rg,):
                err = sum(math.log(timing.concurrent_time(p, resid=(rg, rc, d), **kw) / t) ** 2 for kw, t in samples)
                if best is None or err < best[0]:
                    best = (err, rg, rc, d)
    err, rg, rc, d = best
    return {"gemm": rg, "comm": rc, "delay_s": d, "n": len(samples), "rms_log_error": math.sqrt(err / len(samples))}


def fit_interference(p: HardwareProfile, scenarios: list[dict]) -> dict:
    out: dict = {}
    for family in FAMILY_RUNS:
        per = _samples(p, scenarios, family)
        if not per:
            continue
        delays = DELAYS if family in COMM_FIRST else (0.0,)
        out[family] = {cls: _fit(p, samples, delays) for cls, samples in sorted(per.items())}
        out[family]["any"] = _fit(p, [x for samples in per.values() for x in samples], delays)
    return out
