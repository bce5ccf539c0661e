"""The planner's heuristics: pure functions of (profile, workload) that return plans.

- :func:`launch_order` — schedule prioritization (paper V-C): launch kernels in order of the
  thread blocks they need, low to high, for any number of kernels.
- :func:`resource_partition` — resource partitioning (paper V-C): scale the roofline times by
  the profile's SM-loss and CTA lookup tables for each candidate split and take the split with
  the lowest max(GEMM, collective).
- :func:`copy_engine_sms` — which SMs a memory-bound GEMM gives up beside a copy-engine
  collective (paper VI-G): those at the minimum of its SM-loss table, when that is a speedup.
- :func:`plan_auto` — the copy-engine choice: predict the concurrent time of the SM-collective
  plan the two heuristics above give and of the copy-engine plan, take the faster.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..collectives import REGISTRY as COLLECTIVES
from .profile import HardwareProfile
from ..strategy import RP_SMS, STRATEGIES, strategy_for
from . import timing
from .plan import Plan, PlanError, check_strategy
from .timing import Workload

# cuBLAS's usual bf16 tile on Hopper: the GEMM's thread blocks are its output tiles.
GEMM_TILE_M, GEMM_TILE_N = 128, 256


@dataclass(frozen=True)
class Kernel:
    """A kernel to launch: its name and how many thread blocks it asks for (None: no SM work,
    e.g. a copy-engine collective)."""
    name: str
    blocks: int | None


def gemm_blocks(m: int, n: int, k: int, sm_count: int) -> int:
    """Thread blocks a cuBLAS GEMM launches: one per output tile; when the tiles cannot fill
    the GPU, cuBLAS splits a long K across more blocks (split-K / stream-K) to fill it."""
    tiles = math.ceil(m / GEMM_TILE_M) * math.ceil(n / GEMM_TILE_N)
    return tiles if tiles >= sm_count else min(sm_count, tiles * math.ceil(k / 1024))


def launch_order(kernels: list[Kernel]) -> tuple[str, ...]:
    """Schedule prioritization: fewest thread blocks first, so a kernel that needs few SMs is
    not starved by one that floods them. Work with no thread blocks (copy engines) goes last:
    it takes no SM, and launching it after the kernels hides its host-side enqueue behind them.
    Ties keep the given order."""
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise PlanError(f"kernel names must be distinct, got {names}")
    ranked = sorted(enumerate(kernels), key=lambda ik: (ik[1].blocks is None, ik[1].blocks or 0, ik[0]))
    return tuple(k.name for _, k in ranked)


def workload(gemm, collective: str, size: int, world: int, dtype_bytes: int = 2) -> Workload:
    """Check planner input and build the workload. ``gemm`` is (M, N, K)."""
    if collective not in COLLECTIVES:
        raise PlanError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    try:
        m, n, k = (int(x) for x in gemm)
    except (TypeError, ValueError):
        raise PlanError(f"a GEMM shape is three positive integers M, N, K; got {gemm!r}") from None
    if min(m, n, k) <= 0 or any(int(x) != x for x in gemm):
        raise PlanError(f"a GEMM shape is three positive integers M, N, K; got {gemm!r}")
    if not isinstance(size, int) or size <= 0:
        raise PlanError(f"collective size must be a positive number of bytes, got {size!r}")
    if not isinstance(world, int) or not 2 <= world <= timing.MAX_WORLD:
        raise PlanError(f"world {world!r} is out of range: a collective here spans 2 to {timing.MAX_WORLD} ranks "
                        "(the GPUs of one node)")
    return Workload(m, n, k, collective, size, world, dtype_bytes)


# The smallest SM partition: green contexts grant SMs in steps of 8 on H200 (MI300X: 8 CUs).
MIN_PARTITION = 8


def partition_candidates(p: HardwareProfile, w: Workload) -> tuple[int, ...]:
    """SM splits to try: the CTA counts the profile measured for this collective (at least
    MIN_PARTITION, at most half the GPU), else the study's sweep."""
    band = "latency-bound" if w.size <= timing.LATENCY_BOUND_MAX else "bandwidth-bound"
    keys = sorted(k for k in p.coll_cta_loss.get(w.collective, {}).get(band, {})
                  if MIN_PARTITION <= k <= p.sm_count // 2)
    return tuple(keys) or RP_SMS


def resource_partition(p: HardwareProfile, w: Workload, candidates=None) -> tuple[int, dict]:
    """(SMs reserved for the SM collective, {candidate: (gemm s, collective s)}): the paper's
    heuristic, with the profile's measured efficiencies instead of its 70%."""
    candidates = candidates or partition_candidates(p, w)
    tg, cls = timing.gemm_time(p, w)
    tn = _comm(p, "nccl", w)
    table = {k: (tg * timing.gemm_sm_loss(p, cls, k), tn * timing.comm_cta_loss(p, w.collective, w.size, k))
             for k in candidates}
    best = min(table, key=lambda k: (max(table[k]), k))
    return best, table


def copy_engine_sms(p: HardwareProfile, w: Workload) -> int:
    """SMs a memory-bound GEMM should give up beside a copy-engine collective: where its SM-loss
    table dips below 1 (fewer SMs, better caching, less HBM pressure); 0 when it never does."""
    _, cls = timing.gemm_time(p, w)
    table = p.gemm_sm_loss.get(cls, {})
    if cls != "memory-bound" or not table:
        return 0
    k = min((k for k in table if k > 0), key=lambda k: (table[k], k), default=0)
    return k if k and table[k] < 1.0 else 0


def _comm(p: HardwareProfile, impl: str, w: Workload) -> float:
    t = timing.comm_time(p, impl, w.collective, w.size, w.world)
    if t is None:
        raise PlanError(f"the profile has no {impl} {w.collective} measurements; a measured `conccl study` that runs "
                        f"{w.collective} writes a profile that has")
    return t


def predict(p: HardwareProfile, w: Workload, impl: str, comm_first: bool, gemm_sms_taken: int = 0,
            nccl_ctas: int | None = None) -> dict:
    """Predicted seconds of a plan's parts and of the whole, with the ideal and percent of ideal
    (against the serial run with NCCL, as the study counts them)."""
    tg, cls = timing.gemm_time(p, w)
    tn = _comm(p, "nccl", w)
    tc = _comm(p, impl, w)
    if impl == "conccl":
        t = timing.concurrent_time(p, "ce", cls, tg, tc, w.gemm_bytes, w.comm_hbm_bytes,
                                   gemm_sms_taken=gemm_sms_taken, partitioned=gemm_sms_taken > 0)
    elif nccl_ctas is not None:
        t = timing.concurrent_time(p, "rp_first" if comm_first else "rp", cls, tg, tc, w.gemm_bytes, w.comm_hbm_bytes, gemm_sms_taken=nccl_ctas,
                                   comm_loss=timing.comm_cta_loss(p, w.collective, w.size, nccl_ctas), partitioned=True)
    else:
        t = timing.concurrent_time(p, "sm" if comm_first else "base", cls, tg, tc, w.gemm_bytes, w.comm_hbm_bytes,
                                   comm_sms=timing.default_ctas(p, w.collective, w.size))
    ideal = (tg + tn) / max(tg, tn)
    speedup = (tg + tn) / t
    best = min(x for x in (tn, tc, timing.comm_time(p, "conccl", w.collective, w.size, w.world)) if x)
    return {"gemm_s": tg, "gemm_class": cls, "comm_s": tc, "comm_nccl_s": tn, "comm_best_s": best,
            "concurrent_s": t, "efficiency": timing.efficiency(tg, best, t),
            "ideal": ideal, "speedup": speedup, "pct_ideal": 100 * (speedup - 1) / (ideal - 1)}


def _plan(p: HardwareProfile, w: Workload, impl: str, order: tuple[str, ...], gemm_sms_taken: int = 0,
          nccl_ctas: int | None = None, high_priority: bool = False, reasons=()) -> Plan:
    comm_first = order[0] == "collective"
    name = strategy_for(impl, comm_first, high_priority, bool(gemm_sms_taken or nccl_ctas))
    pred = predict(p, w, impl, comm_first, gemm_sms_taken, nccl_ctas)
    return Plan(name, impl, order, high_priority, nccl_ctas if nccl_ctas is not None else gemm_sms_taken,
                nccl_ctas, w, pred, tuple(reasons))


def candidates(p: HardwareProfile, w: Workload) -> list[Plan]:
    """The plans the heuristics propose, each with its prediction: the SM collective in
    schedule-priority order (and, unpartitioned, in the other order), with and without the
    resource-partitioning split, and the copy-engine collective with the SMs a memory-bound
    GEMM should give up."""
    nccl_first = launch_order([Kernel("gemm", gemm_blocks(w.m, w.n, w.k, p.sm_count)),
                               Kernel("collective", timing.default_ctas(p, w.collective, w.size))])
    k, table = resource_partition(p, w)
    why_sp = f"schedule prioritization: launch order {' -> '.join(nccl_first)} (thread blocks, low to high)"
    why_rp = (f"resource partitioning: {k} SMs for NCCL, predicted max(GEMM, collective) "
              + ", ".join(f"{c}: {1e3 * max(v):.3f} ms" for c, v in table.items()))
    ce_k = copy_engine_sms(p, w)
    ce_order = launch_order([Kernel("gemm", gemm_blocks(w.m, w.n, w.k, p.sm_count)), Kernel("collective", None)])
    why_ce = ("copy engines: no SM for the collective; "
              + (f"the memory-bound GEMM gives up {ce_k} SMs (its SM-loss table dips below 1 there)"
                 if ce_k else "the GEMM keeps every SM"))
    # Schedule prioritization pays for its order with the first collective's host-side launch,
    # which delays the GEMM; a collective shorter than that is better launched second.
    other = tuple(reversed(nccl_first))
    why_other = (f"launch order {' -> '.join(other)} also predicted: prioritization delays the other kernel "
                 "by the first one's launch")
    return [
        _plan(p, w, "nccl", nccl_first, reasons=[why_sp]),
        _plan(p, w, "nccl", other, reasons=[why_other]),
        _plan(p, w, "nccl", nccl_first, nccl_ctas=k, reasons=[why_sp, why_rp]),
        _plan(p, w, "conccl", ce_order, gemm_sms_taken=ce_k, reasons=[why_ce]),
    ]


def plan_auto(p: HardwareProfile, w: Workload) -> Plan:
    """The candidate with the lowest predicted concurrent time (ties: the copy-engine plan,
    then the one without a partition)."""
    cands = candidates(p, w)
    rank = {"conccl": 0, "conccl_rp": 1, "c3_sp": 2, "c3_sp_hp": 2, "c3_base": 2, "c3_sp_rp": 3, "c3_rp": 3}
    best = min(cands, key=lambda c: (round(c.predicted["concurrent_s"], 9), rank[c.strategy]))
    others = ", ".join(f"{c.strategy}: {1e3 * c.predicted['concurrent_s']:.3f} ms" for c in cands if c is not best)
    why = f"chosen: {best.strategy}, predicted {1e3 * best.predicted['concurrent_s']:.3f} ms (others: {others})"
    return Plan(**{**best.__dict__, "reasons": best.reasons + (why,)})


def plan_strategy(p: HardwareProfile, w: Workload, name: str, sms: int | None = None) -> Plan:
    """The plan of a named study strategy (``sms``: its partition, default the heuristic's)."""
    if name == "auto":
        return plan_auto(p, w)
    check_strategy(name, w.collective)
    s = STRATEGIES[name]
    order = ("collective", "gemm") if s.comm_first else ("gemm", "collective")
    if s.partition == "nccl_ctas":
        k = sms if sms is not None else resource_partition(p, w)[0]
        return _plan(p, w, "nccl", order, nccl_ctas=k, high_priority=s.high_priority)
    if s.partition == "gemm_only":
        k = sms if sms is not None else (copy_engine_sms(p, w) or 8)
        return _plan(p, w, "conccl", order, gemm_sms_taken=k)
    return _plan(p, w, s.impl, order, high_priority=s.high_priority)


def plan(p: HardwareProfile, gemm, collective: str, size: int, world: int | None = None,
         strategy: str = "auto", dtype_bytes: int = 2) -> Plan:
    """The plan for a GEMM (M, N, K) beside ``collective`` of ``size`` output bytes per rank."""
    w = workload(gemm, collective, size, world if world is not None else p.world, dtype_bytes)
    return plan_strategy(p, w, strategy)
