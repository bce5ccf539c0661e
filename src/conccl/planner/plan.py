"""A plan: how one computation and one collective run together. Plain, frozen data."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..strategy import STRATEGIES, runtime_strategies
from .timing import Workload


class PlanError(ValueError):
    """Bad planner input: an unknown strategy or collective, or a shape that is not a GEMM."""


@dataclass(frozen=True)
class Plan:
    strategy: str  # a name of conccl.strategy.STRATEGIES
    impl: str  # collective implementation: "nccl" (SM kernels) or "conccl" (copy engines)
    launch_order: tuple[str, ...]  # kernel names, the first is launched first
    comm_high_priority: bool  # the collective's stream at high priority
    gemm_sms_taken: int  # SMs withheld from the GEMM (a green context holds the rest); 0: all SMs
    nccl_ctas: int | None  # cap on NCCL's CTAs (ProcessGroupNCCL max_ctas); None: NCCL's choice
    workload: Workload
    predicted: dict = field(default_factory=dict)  # seconds: gemm, comm, comm_nccl, comm_best, concurrent; efficiency, ideal, pct_ideal
    reasons: tuple[str, ...] = ()

    @property
    def comm_first(self) -> bool:
        return self.launch_order[0] == "collective"

    @property
    def sms(self) -> int:
        """The study's sweep key of this plan: SMs reserved (NCCL CTAs, or SMs a GEMM gives up)."""
        return self.nccl_ctas if self.nccl_ctas is not None else self.gemm_sms_taken

    def to_dict(self) -> dict:
        d = asdict(self)
        d["launch_order"] = list(self.launch_order)
        d["reasons"] = list(self.reasons)
        return d


def check_strategy(name: str, collective: str) -> None:
    s = STRATEGIES.get(name)
    if s is None or not s.runtime_applies:
        known = ", ".join(runtime_strategies())
        raise PlanError(f"unknown strategy {name!r}; known: auto, {known}")
    if not s.runs(collective):
        raise PlanError(f"strategy {name!r} does not run {collective}")
