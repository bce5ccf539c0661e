"""What a measured study is asked to run (:class:`StudyConfig`), its sweeps, and the memory
it needs per GPU."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import collectives
from ..strategy import STRATEGIES
from .results import StudyResults
from .scenarios import Scenario

SIZE_SWEEP = tuple(1 << s for s in (20, 22, 24, 26, 28, 30, 32))  # 1M .. 4G
SIZE_SWEEP_QUICK = tuple(1 << s for s in (20, 24, 28))
CTA_SWEEP = (1, 2, 4, 8, 16, 32)
CTA_SWEEP_QUICK = (1, 4, 16)
CTA_SIZES = (1 << 20, 1 << 30)  # a latency-bound and a bandwidth-bound size
CTA_SIZES_QUICK = (1 << 20, 1 << 28)
# The eager sweep (study.measure._eager_sweep): calls back to back per timed execution, and the
# largest size it times (its verdict there holds above it: conccl.planner.eager).
EAGER_CALLS = 20
EAGER_MAX = 256 << 20
SM_LOSS = (0, 8, 16, 32, 64)
SM_LOSS_QUICK = (0, 16, 64)
# NCCL's communicators (one per CTA cap and priority the strategies use), verification
# temporaries, allocator slack: 4.6 GiB beside the arenas and operands when a two-H100 run first
# ran out of memory (what a whole run holds beside them grows as it goes)
HEADROOM = 5 << 30


class StudyError(RuntimeError):
    """The study cannot run as asked (too few GPUs, does not fit in memory, ...)."""


@dataclass
class StudyConfig:
    scenarios: list[Scenario]
    quick: bool = False
    # One GPU's memory, the same figure on every rank: the arenas are planned from it
    # (arena_plan), and symmetric allocations must be equal on every rank.
    memory_bytes: int = 0
    skipped: list = field(default_factory=list)  # results.Skipped: suite scenarios that cannot fit
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
    # turns: a fair head-to-head, free of what ran just before each.
    auto_in_turns: bool = True
    # An interrupted run's results to continue: every rank skips the steps it holds (the same
    # steps on every rank, so the collectives still pair up), rank 0 appends the rest.
    resume: StudyResults | None = None


def sweep_sizes(quick: bool, memory_bytes: int | None = None) -> tuple[int, ...]:
    """The collectives' size sweep: those sizes whose two arenas (output, input) fit beside the
    headroom in ``memory_bytes`` (None: all)."""
    sizes = SIZE_SWEEP_QUICK if quick else SIZE_SWEEP
    return tuple(s for s in sizes if memory_bytes is None or 2 * s + HEADROOM <= memory_bytes)


def eager_sizes(sweep: tuple[int, ...]) -> tuple[int, ...]:
    """The sizes of the size sweep ``sweep`` that the eager sweep times too."""
    return tuple(s for s in sweep if s <= EAGER_MAX)


def scenario_arenas(s: Scenario, world: int) -> tuple[int, int]:
    """The symmetric arenas (output, input) scenario ``s`` runs in."""
    size = s.size_for(world)
    return size, collectives.get(s.collective).input_bytes(size, world)


def _beside_arenas(s: Scenario, world: int) -> int:
    """What scenario ``s`` allocates beside its arenas: the GEMM's operands and, where PyTorch's
    copy-engine op runs, the output it allocates on every call."""
    return s.gemm.bytes() + (s.size_for(world) if STRATEGIES["torch_lc"].runs(s.collective) else 0)


def scenario_bytes(s: Scenario, world: int) -> int:
    """GPU memory one rank needs to run scenario ``s`` alone (its arenas sized for it)."""
    return sum(scenario_arenas(s, world)) + _beside_arenas(s, world) + HEADROOM


def arena_plan(scenarios: list[Scenario], world: int, quick: bool,
               memory_bytes: int) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """(the arenas of the collective sweeps, the arenas each scenario runs in), in bytes.

    A pure function of the study's inputs, so every rank derives the same plan: symmetric
    allocations are collective and must have equal sizes on every rank. The arenas held grow
    to take the next scenario where the grown arenas still fit beside it; otherwise they are
    released and allocated exactly for it. So every scenario that fits alone runs (the largest
    default one needs 76.4 GiB of an 80 GB H100 at two ranks), with nothing shrunk."""
    sweep = max(sweep_sizes(quick, memory_bytes), default=0)
    held = (sweep, sweep)
    plan = []
    for s in scenarios:
        o, i = scenario_arenas(s, world)
        grown = (max(held[0], o), max(held[1], i))
        held = grown if sum(grown) + _beside_arenas(s, world) + HEADROOM <= memory_bytes else (o, i)
        plan.append(held)
    return (sweep, sweep), plan
