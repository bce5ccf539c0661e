"""Fit the profile's interference residuals on measured scenarios (the reference GEMMs').

For each pairing and GEMM class, the (gemm, comm) slowdowns that, put into
:func:`conccl.planner.timing.concurrent_time` with the scenario's measured isolated times,
best reproduce the measured concurrent times (least squares on log time, grid search).
The scenarios come as :class:`Observation` (the study turns its results into them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import timing
from .profile import HardwareProfile

# Residual slowdowns tried: fine steps near 1, coarse up to "effectively serial".
GRID = tuple(round(0.8 + 0.02 * i, 2) for i in range(61)) + (2.5, 3.0, 4.0, 6.0, 10.0, 30.0, 100.0)
DELAYS = tuple(1e-6 * d for d in (0, 5, 10, 15, 20, 30, 40))  # a GEMM launched behind an NCCL call
FAMILY_RUNS = {"ce": ("conccl",), "sm": ("c3_sp",), "base": ("c3_base",), "rp": ("c3_rp",), "rp_first": ("c3_sp_rp",)}
COMM_FIRST = ("sm", "rp_first")


@dataclass(frozen=True)
class Observation:
    """One measured scenario as the fit reads it: a GEMM of ``gemm_class`` beside a collective,
    the medians of each alone and of each strategy's runs together (seconds)."""

    gemm_class: str
    collective: str
    size: int  # collective output bytes per rank
    gemm_bytes: int  # the GEMM's compulsory HBM bytes
    comm_bytes: int  # the collective's HBM bytes (one rank)
    t_gemm: float
    t_comm: dict = field(default_factory=dict)  # impl -> seconds alone
    # strategy -> ((SMs reserved, SMs the GEMM had or None, seconds together), ...)
    runs: dict = field(default_factory=dict)


def _samples(p: HardwareProfile, observations: list[Observation], family: str) -> dict:
    """class -> [(kwargs for concurrent_time, measured seconds)]."""
    out: dict = {}
    for s in observations:
        cls = s.gemm_class
        tg = s.t_gemm
        for name in FAMILY_RUNS[family]:
            impl = "conccl" if family == "ce" else "nccl"
            if name not in s.runs or impl not in s.t_comm:
                continue
            tc = s.t_comm[impl]
            for sms, gemm_sms, seconds in s.runs[name]:
                kw = {"family": family, "cls": cls, "t_gemm": tg, "t_comm": tc, "gemm_bytes": s.gemm_bytes,
                      "comm_bytes": s.comm_bytes}
                if family in ("rp", "rp_first"):
                    taken = p.sm_count - gemm_sms if gemm_sms else sms
                    kw.update(gemm_sms_taken=taken, partitioned=True,
                              comm_loss=timing.comm_cta_loss(p, s.collective, s.size, sms))
                elif family == "sm":
                    kw.update(comm_sms=timing.default_ctas(p, s.collective, s.size))
                out.setdefault(cls, []).append((kw, seconds))
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


def fit_interference(p: HardwareProfile, observations: list[Observation]) -> dict:
    out: dict = {}
    for family in FAMILY_RUNS:
        per = _samples(p, observations, family)
        if not per:
            continue
        delays = DELAYS if family in COMM_FIRST else (0.0,)
        out[family] = {cls: _fit(p, samples, delays) for cls, samples in sorted(per.items())}
        out[family]["any"] = _fit(p, [x for samples in per.values() for x in samples], delays)
    return out
