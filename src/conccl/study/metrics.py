"""The study's formulas, as ../shared/ARCHITECTURE.md defines them. Pure functions of times.

- ideal speedup = (t_gemm + t_comm) / max(t_gemm, t_comm), both measured in isolation;
- speedup = (t_gemm + t_comm) / t_concurrent, where t_comm is the baseline collective's
  (NCCL's) isolated time for every strategy: the serial run a user has today;
- percent of ideal = (speedup - 1) / (ideal - 1), in percent: the paper's; it divides by
  (ideal - 1), so it explodes where one kernel is much longer than the other;
- efficiency = max(t_gemm, t_comm_best) / t_concurrent, in percent, t_comm_best the fastest
  collective alone: the headline, defined for every pair (``conccl.planner.timing.efficiency``);
- taxonomy: G-long when the GEMM takes > 1.15x the collective, C-long when the collective takes
  > 1.15x the GEMM, GC-equal otherwise.
"""
from __future__ import annotations

import math
import statistics

from ..planner.timing import ILL_CONDITIONED, efficiency

__all__ = ["EQUAL_BAND", "ILL_CONDITIONED", "efficiency", "ideal_speedup", "speedup", "percent_of_ideal", "taxonomy",
           "gemm_class", "fit_latency_bandwidth", "comm_class"]

EQUAL_BAND = 0.15


def ideal_speedup(t_gemm: float, t_comm: float) -> float:
    _positive(t_gemm=t_gemm, t_comm=t_comm)
    return (t_gemm + t_comm) / max(t_gemm, t_comm)


def speedup(t_gemm: float, t_comm: float, t_concurrent: float) -> float:
    _positive(t_gemm=t_gemm, t_comm=t_comm, t_concurrent=t_concurrent)
    return (t_gemm + t_comm) / t_concurrent


def percent_of_ideal(speedup_: float, ideal: float) -> float:
    """(speedup - 1) / (ideal - 1) x 100; negative when slower than serial."""
    if ideal <= 1.0:
        raise ValueError(f"ideal speedup must exceed 1, got {ideal}")
    return 100.0 * (speedup_ - 1.0) / (ideal - 1.0)


def taxonomy(t_gemm: float, t_comm: float, band: float = EQUAL_BAND) -> str:
    _positive(t_gemm=t_gemm, t_comm=t_comm)
    if t_gemm > (1 + band) * t_comm:
        return "G-long"
    if t_comm > (1 + band) * t_gemm:
        return "C-long"
    return "GC-equal"


def gemm_class(flops: float, nbytes: float, seconds: float, peak_flops: float, peak_bytes_per_s: float) -> str:
    """Compute- or memory-bound, by measurement: whichever roof the achieved rate is closer to.

    The paper compares a kernel's op-to-byte with the machine's (peak flops / peak bandwidth);
    with compulsory bytes that says what a perfect kernel would be. Dividing both achieved rates
    by their peaks says what this kernel on this GPU actually is."""
    _positive(seconds=seconds, peak_flops=peak_flops, peak_bytes_per_s=peak_bytes_per_s)
    return "compute-bound" if flops / seconds / peak_flops >= nbytes / seconds / peak_bytes_per_s else "memory-bound"


def fit_latency_bandwidth(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """t(size) = latency + size / bandwidth, least squares over a size sweep (bytes, s)."""
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError("need at least two (size, time) points")
    mx, my = statistics.fmean(sizes), statistics.fmean(seconds)
    sxx = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / sxx
    if slope <= 0:
        raise ValueError("time does not grow with size: cannot fit a bandwidth")
    latency = max(0.0, my - slope * mx)
    return latency, 1.0 / slope


def comm_class(size: int, latency_s: float, bytes_per_s: float) -> str:
    """Latency-bound while the fixed cost is at least the size-proportional time (the size
    where time stops being flat), bandwidth-bound beyond."""
    return "latency-bound" if latency_s >= size / bytes_per_s else "bandwidth-bound"


def _positive(**kw):
    for k, v in kw.items():
        if not (v > 0) or math.isinf(v):
            raise ValueError(f"{k} must be a positive finite number, got {v}")
