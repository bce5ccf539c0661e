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
SM_LOSS = (0, 8, 16, 32, 64)
SM_LOSS_QUICK = (0, 16, 64)
HEADROOM = 3 << 30  # NCCL buffers, verification temporaries, allocator slack


class StudyError(RuntimeError):
    """The study cannot run as asked (too few GPUs, does not fit in memory, ...)."""


@dataclass
class StudyConfig:
    scenarios: list[Scenario]
    quick: bool = False
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
    # turns: a fair head-to-head, free of what ran just before each (scripts/auto_gap.py).
    auto_in_turns: bool = True
    # An interrupted run's results to continue: every rank skips the steps it holds (the same
    # steps on every rank, so the collectives still pair up), rank 0 appends the rest.
    resume: StudyResults | None = None


def arena_bytes(scenarios: list[Scenario], world: int, quick: bool) -> tuple[int, int]:
    """Symmetric arenas (output, input) large enough for every scenario and sweep.

    Allocated once: symmetric allocations must have equal sizes on every rank, and the
    allocator may return cached blocks of other sizes if allocations came and went."""
    sweep = max(SIZE_SWEEP_QUICK if quick else SIZE_SWEEP)
    out = max([s.size_for(world) for s in scenarios] + [sweep])
    inp = max([collectives.get(s.collective).input_bytes(s.size_for(world), world) for s in scenarios] + [sweep])
    return out, inp


def required_bytes(scenarios: list[Scenario], world: int, quick: bool) -> int:
    out, inp = arena_bytes(scenarios, world, quick)
    # torch_lc's op allocates its whole output on every call, beside the arenas.
    per = max(s.gemm.bytes() + (s.size_for(world) if STRATEGIES["torch_lc"].runs(s.collective) else 0)
              for s in scenarios)
    return out + inp + per + HEADROOM

