"""The records of a study's results (:class:`StudyResults` and every record it holds), typed:
what ``results.json`` holds, field by field (JSON field names are the attribute names). Read
and written only by :mod:`conccl.study.results`.

Measured and predicted studies fill the same raw fields (times in milliseconds, each a
:class:`Timing`); :func:`conccl.study.analysis.derive` fills the derived ones (classes, ideal
speedups, taxonomy, per-strategy results, the summary and the paper's claims).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

SCHEMA = "conccl-study-results/5"  # the schema these records are (older ones: conccl.study.results)
KINDS = ("measured", "prediction")


class ResultsError(ValueError):
    """A results file that is unreadable, of an unknown schema, or malformed."""


# ----------------------------------------------------------------------------- raw records

@dataclass
class Timing:
    """Milliseconds of a configuration's timed runs (the slowest rank's): median and spread.
    ``n`` = 0: a single modelled value (a prediction)."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> "Timing":
        if not values:
            raise ValueError("no values")
        return cls(statistics.median(values), min(values), max(values), len(values))

    @classmethod
    def point(cls, ms: float) -> "Timing":
        return cls(ms, ms, ms, 0)


@dataclass
class RunConfig:
    """How the numbers were taken (fields after ``world``: None in studies from before they existed)."""

    quick: bool
    warmup: int
    iters: int
    world: int
    side_by_side: bool | None = None
    min_timed_ms: float | None = None
    max_iters: int | None = None
    auto_in_turns: bool | None = None
    conccl_call: str | None = None  # "persistent": conccl ran as a persistent op


@dataclass
class Machine:
    device: str
    sm_count: int
    memory_bytes: int
    world: int
    nvlinks: int = 0  # active NVLinks of rank 0's GPU (NVML); 0: not read


@dataclass
class CommFit:
    """t(size) = latency_s + size / bytes_per_s over a size sweep."""

    latency_s: float
    bytes_per_s: float


@dataclass
class Peaks:
    bf16_flops: float | None = None  # best GEMM rate of the study, flop/s
    hbm_bytes_per_s: float | None = None  # same-GPU copy, read + write
    nvlink_bytes_per_s: float | None = None  # best copy-engine bus bandwidth per GPU
    op_to_byte: float | None = None  # derived: bf16_flops / hbm_bytes_per_s
    collective_fits: dict[str, dict[str, CommFit]] = field(default_factory=dict)  # impl -> collective -> fit


@dataclass
class GemmSmLoss:
    """A GEMM alone in a green context that withholds SMs."""

    gemm: str  # tag
    mnk: str
    flops: int
    bytes: int
    sms_taken: int
    sms_granted: int
    time_ms: Timing
    sms_asked: int | None = None  # measured only: SMs asked of the green context
    slowdown: float | None = None  # derived: against the same GEMM on every SM


@dataclass
class CopyBesideGemm:
    """One GPU: a GEMM and a copy-engine copy (``kind``: "d2d", a same-GPU copy, or "h2d",
    pinned host memory to the GPU) alone and together on two streams: how much of the copy
    hides behind the GEMM, and what it costs the GEMM (HBM and L2 shared, no SM taken)."""

    gemm: str  # tag
    mnk: str
    kind: str
    copy_bytes: int
    gemm_ms: Timing
    copy_ms: Timing
    together_ms: Timing
    efficiency: float | None = None  # derived: max(alone) / together, 100% = the shorter hidden


@dataclass
class CollSize:
    """A collective alone at one size."""

    collective: str
    size: int
    impl: str
    time_ms: Timing
    correct: bool | None = None
    hbm_bytes: int | None = None


@dataclass
class CollCtas:
    """A collective alone with NCCL capped to ``ctas`` CTAs (None: NCCL's choice; 0: conccl)."""

    collective: str
    size: int
    impl: str
    ctas: int | None
    time_ms: Timing
    slowdown: float | None = None  # derived: against NCCL's choice


@dataclass
class GemmInfo:
    tag: str
    m: int
    n: int
    k: int
    flops: int
    bytes: int  # compulsory HBM bytes
    source: str = ""
    paper_class: str | None = None


@dataclass
class HbmBytes:
    gemm: int
    comm: int


@dataclass
class Run:
    """One strategy at one sweep point, run beside the GEMM."""

    sms: int  # SMs reserved (NCCL CTAs, or SMs the GEMM gives up); 0: no partition
    gemm_sms: int | None  # SMs the GEMM had
    time_ms: Timing
    correct: bool | None = None
    plan: str | None = None  # the strategy the planner picked (auto; every run of a prediction)
    speedup: float | None = None  # derived
    pct_ideal: float | None = None  # derived
    pct_own_ideal: float | None = None  # derived
    efficiency: float | None = None  # derived: max(t_gemm, fastest collective alone) / t_concurrent, %


@dataclass
class StrategyResult:
    """A strategy's best run in a scenario (derived)."""

    time_ms: Timing
    speedup: float
    pct_ideal: float
    pct_own_ideal: float
    sms: int
    gemm_sms: int | None
    correct: bool | None
    efficiency: float | None = None  # the headline, percent (None in results of schema 2 until derived)


@dataclass
class Skipped:
    """A scenario of the suite the study did not run, and why (it cannot fit in one GPU's
    memory): kept out of every mean, named in the report."""

    id: str
    reason: str


@dataclass
class AutoInTurns:
    """``auto`` and the fastest strategy the runtime applies, timed again in turns."""

    strategy: str
    sms: int
    best_ms: Timing
    auto_ms: Timing
    correct: bool


@dataclass
class ScenarioResult:
    id: str
    tag: str
    collective: str
    size: int  # output bytes per rank, as run
    size_asked: int
    source: str
    paper_taxonomy: str | None
    gemm: GemmInfo
    t_gemm: Timing | None = None
    t_comm: dict[str, Timing] = field(default_factory=dict)  # impl -> alone
    runs: dict[str, list[Run]] = field(default_factory=dict)  # strategy -> its sweep
    hbm_bytes: HbmBytes | None = None
    auto_in_turns: AutoInTurns | None = None
    # Derived (analysis.derive); None until then.
    gemm_op_to_byte: float | None = None
    gemm_flops_per_s: float | None = None
    gemm_hbm_bytes_per_s: float | None = None
    gemm_dram_bytes: float | None = None  # ncu
    gemm_l2_bytes: float | None = None  # ncu
    gemm_measured_op_to_byte: float | None = None  # ncu
    gemm_class: str | None = None
    gemm_class_by: str | None = None
    comm_class: str | None = None
    comm_hbm_bytes_per_s: dict[str, float] | None = None
    ideal: float | None = None
    taxonomy: str | None = None
    t_comm_best: float | None = None  # ms: the fastest collective alone (NCCL or copy engines)
    strategies: dict[str, StrategyResult] | None = None  # None: not derived (no NCCL time alone)
    c3_best: str | None = None
    best: str | None = None

    @classmethod
    def new(cls, s, size: int) -> "ScenarioResult":
        """The empty record of study scenario ``s`` run at ``size`` bytes."""
        g = s.gemm
        return cls(s.id, s.tag, s.collective, size, s.size, s.source, s.paper_taxonomy,
                   GemmInfo(g.tag, g.m, g.n, g.k, g.flops, g.bytes(), g.source, g.paper_class))


# ----------------------------------------------------------------------------- derived records

@dataclass
class StrategySummary:
    mean_pct_ideal: float
    min_pct_ideal: float
    mean_pct_own_ideal: float | None
    mean_speedup: float
    n: int
    n_at_least_80: int  # scenarios at >= 80% of ideal (the paper's yardstick)
    mean_efficiency: float | None = None  # the headline
    min_efficiency: float | None = None


@dataclass
class GroupSummary:
    """Scenarios of one (collective, taxonomy): means per strategy."""

    n: int
    ideal: float
    speedup: dict[str, float]
    pct_ideal: dict[str, float]
    efficiency: dict[str, float] = field(default_factory=dict)


@dataclass
class Summary:
    strategies: dict[str, StrategySummary]
    groups: dict[str, GroupSummary]
    n_scenarios: int
    wrong: list[str]  # "scenario:strategy" whose output was wrong
    ideal_mean: float | None


@dataclass
class Claim:
    claim: str
    paper: str
    value: float | None
    unit: str
    holds: bool | None = None
    efficiency: float | None = None  # beside a mean percent of ideal: the same strategy's mean efficiency


@dataclass
class StudyResults:
    kind: str  # "measured" | "prediction"
    meta: dict  # environment: date, commit, machine_kind, versions
    config: RunConfig
    complete: bool = False
    machine: Machine | None = None
    peaks: Peaks = field(default_factory=Peaks)
    ncu: dict = field(default_factory=dict)  # GEMM tag -> ncu counters, or {"error": why}
    auto_skipped: str | None = None  # why "auto" did not run
    skipped: list[Skipped] = field(default_factory=list)  # suite scenarios not run, with why
    # Where each part of the report came from, where not all of it is of ``kind``: a one-GPU
    # study measures the GPU's own parts and predicts the collectives' from a profile.
    # part ("hbm", "gemm_sm_loss", "copy_beside_gemm", "collectives", "scenarios") ->
    # "measured" | "predicted from <profile>"
    parts: dict[str, str] = field(default_factory=dict)
    gemm_sm_loss: list[GemmSmLoss] = field(default_factory=list)
    coll_sizes: list[CollSize] = field(default_factory=list)
    # The public functions called eagerly on ordinary tensors, ``EAGER_CALLS`` back to back per
    # timed execution, ``time_ms`` per call: what ``set_eager_path("auto")`` chooses between
    # (impl "conccl": copy engines, staged; "nccl": torch.distributed's). A call's host time
    # counts here, where the persistent ops of ``coll_sizes`` leave it out.
    eager_sizes: list[CollSize] = field(default_factory=list)
    coll_ctas: list[CollCtas] = field(default_factory=list)
    copy_beside_gemm: list[CopyBesideGemm] = field(default_factory=list)  # a one-GPU study's
    scenarios: list[ScenarioResult] = field(default_factory=list)
    wall_s: float | None = None
    error: str | None = None  # why an incomplete run stopped
    summary: Summary | None = None  # derived
    claims: list[Claim] | None = None  # derived
    schema: str = SCHEMA

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ResultsError(f"study kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.schema != SCHEMA:
            raise ResultsError(f"study results of schema {self.schema!r}; this conccl writes {SCHEMA!r}")

    @property
    def world(self) -> int:
        return self.machine.world if self.machine else self.config.world

