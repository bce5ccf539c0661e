"""What the planner predicts from a hardware profile: isolated and concurrent times.

Pure functions of a :class:`~conccl.planner.profile.HardwareProfile` and a workload; times in seconds.

- GEMM alone: roofline, max(flops / (peak x eff), bytes / (HBM x eff)), with the efficiency the
  profile measured for the GEMM's class (the paper assumed 70% of peak everywhere).
- Collective alone: the profile's measured size sweep, interpolated log-log between measured
  sizes (a latency + size / bandwidth fit beyond them); the fit alone is wrong by 2x at 2 MiB.
- Two kernels together (:func:`two_phase`): while both run, each progresses at its own slowdown;
  once one ends, the other runs alone (at its partitioned rate if it keeps a partition).
  Slowdowns while both run: the SMs each side loses (the profile's lookup tables), times the
  share of HBM bandwidth when both together ask for more than the GPU has, times the
  profile's fitted interference residual for that pairing (``profile.interference``: one
  slowdown for both sides, and for a collective launched first the delay its host-side launch
  puts before the GEMM's start).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from .. import collectives
from .profile import HardwareProfile

DEFAULT_EFFICIENCY = 0.7  # the paper's assumption, where a profile has no measured efficiency
LATENCY_BOUND_MAX = 32 << 20  # the profile's CTA table for sizes up to here is the latency-bound one
MAX_WORLD = 8  # the GPUs of one NVLink node (HGX/DGX): the copy-engine paths serve one node


def efficiency(t_gemm: float, t_comm_best: float, t_concurrent: float) -> float:
    """The headline, in percent (../shared/ARCHITECTURE.md, "Words"): max(t_gemm, t_comm_best) /
    t_concurrent, t_comm_best the fastest collective alone (NCCL or copy engines). 100: the
    shorter kernel wholly hidden behind the longer one at its best isolated speed. Unlike
    percent of ideal it never divides by a difference, so it is well defined for every pair."""
    for name, v in (("t_gemm", t_gemm), ("t_comm_best", t_comm_best), ("t_concurrent", t_concurrent)):
        if not (0 < v < math.inf):
            raise ValueError(f"{name} must be a positive finite number, got {v}")
    return 100.0 * max(t_gemm, t_comm_best) / t_concurrent


ILL_CONDITIONED = 1.1  # below this ideal speedup, percent of ideal divides by less than 0.1


def extrapolation(p: HardwareProfile, world: int) -> str | None:
    """Why a prediction for ``world`` ranks is an extrapolation (None: the profile's own world)."""
    if world == p.world:
        return None
    return (f"extrapolated to {world} GPUs from a profile measured on {p.world}: collective times come from its "
            f"latency + bus-bandwidth fit, not its measured size sweep, and the overlap it measured on {p.world} "
            "GPUs is assumed to hold")


@dataclass(frozen=True)
class Workload:
    """A GEMM C[M x N] = A[M x K] @ B[K x N] beside a collective of ``size`` output bytes per rank."""
    m: int
    n: int
    k: int
    collective: str
    size: int
    world: int
    dtype_bytes: int = 2

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def gemm_bytes(self) -> int:
        return self.dtype_bytes * (self.m * self.k + self.k * self.n + self.m * self.n)

    @property
    def comm_hbm_bytes(self) -> int:
        """Local HBM bytes one rank's collective reads and writes, run as the study runs it."""
        return collectives.get(self.collective).hbm_bytes(self.size, self.world)


def gemm_time(p: HardwareProfile, w: Workload) -> tuple[float, str]:
    """(seconds, class) of the GEMM alone on all SMs."""
    ce = p.gemm_efficiency.get("compute-bound", DEFAULT_EFFICIENCY)
    me = p.gemm_efficiency.get("memory-bound", DEFAULT_EFFICIENCY)
    t_c = w.flops / (p.bf16_flops * ce)
    t_m = w.gemm_bytes / (p.hbm_bytes_per_s * me)
    return max(t_c, t_m), ("compute-bound" if t_c >= t_m else "memory-bound")


def comm_time(p: HardwareProfile, impl: str, collective: str, size: int, world: int) -> float | None:
    """Seconds of the collective alone, or None where the profile has nothing for ``impl``."""
    sweep = p.comm_sweep.get(impl, {}).get(collective) if world == p.world else None
    if sweep and len(sweep) >= 2:
        sizes = [s for s, _ in sweep]
        if sizes[0] <= size <= sizes[-1]:
            i = min(max(bisect.bisect_left(sizes, size), 1), len(sizes) - 1)
            (s0, t0), (s1, t1) = sweep[i - 1], sweep[i]
            f = (math.log(size) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    fit = p.collectives.get(impl, {}).get(collective)
    if not fit:
        return None
    return fit["latency_s"] + size * (world - 1) / world / fit["bus_bytes_per_s"]


def lookup(table: dict, key: int, default: float = 1.0) -> float:
    """A lookup-table slowdown at ``key``, linear between measured points, flat beyond."""
    if not table:
        return default
    keys = sorted(table)
    if key <= keys[0]:
        return table[keys[0]]
    if key >= keys[-1]:
        return table[keys[-1]]
    i = bisect.bisect_left(keys, key)
    k0, k1 = keys[i - 1], keys[i]
    return table[k0] + (table[k1] - table[k0]) * (key - k0) / (k1 - k0)


def gemm_sm_loss(p: HardwareProfile, cls: str, sms_taken: int) -> float:
    if sms_taken <= 0:
        return 1.0
    return lookup({0: 1.0, **p.gemm_sm_loss.get(cls, {})}, sms_taken)


def comm_cta_loss(p: HardwareProfile, collective: str, size: int, ctas: int | None) -> float:
    if ctas is None:
        return 1.0
    band = "latency-bound" if size <= LATENCY_BOUND_MAX else "bandwidth-bound"
    return lookup(p.coll_cta_loss.get(collective, {}).get(band, {}), ctas)


def default_ctas(p: HardwareProfile, collective: str, size: int) -> int:
    """SMs an uncapped NCCL collective occupies: the fewest CTAs within 3% of uncapped speed."""
    band = "latency-bound" if size <= LATENCY_BOUND_MAX else "bandwidth-bound"
    table = p.coll_cta_loss.get(collective, {}).get(band, {})
    fast = [k for k, v in sorted(table.items()) if v <= 1.03]
    return fast[0] if fast else max(table, default=32)


def two_phase(a: float, b: float, slow_a: float, slow_b: float, a_alone: float = 1.0, b_alone: float = 1.0,
              delay_a: float = 0.0, delay_b: float = 0.0) -> float:
    """Seconds until both of two concurrent kernels finish.

    ``a``, ``b``: each one's time alone; ``slow_a``, ``slow_b``: its slowdown while both run;
    ``a_alone``, ``b_alone``: its slowdown while it runs alone (1 unless it keeps a partition);
    ``delay_a``, ``delay_b``: when it starts (behind another launch's host-side cost, or a
    copy-engine collective's fixed cost before its copies move data); the one that starts
    first runs alone until the other starts."""
    if delay_a > delay_b:
        return two_phase(b, a, slow_b, slow_a, b_alone, a_alone, delay_b, delay_a)
    lead = delay_b - delay_a  # A runs alone for this long first
    if lead >= a * a_alone:
        return max(delay_a + a * a_alone, delay_b + b * b_alone)
    a_left = a * (1.0 - lead / (a * a_alone))
    ta, tb = a_left * slow_a, b * slow_b
    if ta <= tb:
        return delay_b + ta + (1.0 - ta / tb) * b * b_alone
    return delay_b + tb + (1.0 - tb / ta) * a_left * a_alone


def hbm_share(p: HardwareProfile, gemm_bytes_per_s: float, comm_bytes_per_s: float) -> float:
    """Slowdown of both sides when together they ask more of HBM than it delivers."""
    return max(1.0, (gemm_bytes_per_s + comm_bytes_per_s) / p.hbm_bytes_per_s)


def residual(p: HardwareProfile, family: str, cls: str) -> tuple[float, float, float]:
    """The profile's fitted (gemm slowdown, collective slowdown, GEMM start delay in seconds)
    for a pairing, beyond lost SMs and shared HBM."""
    r = p.interference.get(family, {}).get(cls) or p.interference.get(family, {}).get("any")
    return (r["gemm"], r["comm"], r.get("delay_s", 0.0)) if r else (1.0, 1.0, 0.0)


def concurrent_time(p: HardwareProfile, family: str, cls: str, t_gemm: float, t_comm: float,
                    gemm_bytes: float, comm_bytes: float, gemm_sms_taken: int = 0,
                    comm_loss: float = 1.0, comm_sms: int = 0, partitioned: bool = False,
                    resid: tuple[float, float, float] | None = None) -> float:
    """Predicted seconds for the GEMM and the collective together.

    ``family``: "ce" (copy-engine collective), "sm" (SM collective launched first), "base"
    (SM collective launched after the GEMM), "rp" (both confined to an SM partition).
    ``gemm_sms_taken``: SMs withheld from the GEMM (a green context, for the whole run when
    ``partitioned``); ``comm_sms``: SMs an SM collective occupies while it runs;
    ``comm_loss``: the collective's slowdown from a CTA cap; ``resid``: (gemm, comm, GEMM start
    delay) instead of the profile's fitted residual (for fitting it)."""
    lg_part = gemm_sm_loss(p, cls, gemm_sms_taken)
    lg = lg_part if partitioned else gemm_sm_loss(p, cls, max(gemm_sms_taken, comm_sms))
    rg, rc, delay = resid or residual(p, family, cls)
    # A GEMM that loses SMs also asks less of HBM.
    share = hbm_share(p, gemm_bytes / (t_gemm * lg), comm_bytes / (t_comm * comm_loss))
    if family == "base" and resid is None and not p.interference.get("base"):
        return t_gemm + t_comm * comm_loss  # the collective waits for the GEMM's SMs: serial
    t = two_phase(t_gemm, t_comm * comm_loss, lg * share * rg, share * rc,
                  a_alone=lg_part if partitioned else 1.0, delay_a=delay)
    # Without a partition the GPU can always fall back to running one kernel after the other.
    return t if partitioned else min(t, delay + t_gemm + t_comm * comm_loss)
