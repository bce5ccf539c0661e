"""The one vocabulary of C3 strategies, shared by the runtime, the planner and the study.

A strategy says how a computation (a GEMM) and a collective run together: which collective
implementation, which is launched first, the collective stream's priority, and which SM
partitions are tried (the study takes the best of the sweep as the strategy's figure). The
planner's plans, the runtime's ``plan=`` argument, the study's tables and the hardware
profile all name strategies by :attr:`Strategy.name`; :func:`strategy_for` turns a
combination of knobs back into that name.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Mover", "Partition", "Strategy", "STRATEGIES", "PAPER_STRATEGIES", "RP_SMS", "RP_SMS_QUICK",
           "CE_RP_SMS", "CE_RP_SMS_QUICK", "strategies_for", "strategy_for", "runtime_strategies"]

# SMs reserved for the collective in resource-partitioning sweeps (powers of two, as the
# paper swept CUs). The GEMM runs in a green context holding the rest.
RP_SMS = (8, 16, 32)
RP_SMS_QUICK = (16,)
# SMs a GEMM gives up beside copy-engine collectives (the paper's ConCCL_rp took 8 CUs).
CE_RP_SMS = (8, 16)
CE_RP_SMS_QUICK = (8,)


class Mover(str, enum.Enum):
    """Who moves the collective's bytes. A ``str`` enum: results files store the value."""

    NCCL = "nccl"          # NCCL's SM kernels
    CONCCL = "conccl"      # conccl's copy engines
    TORCH_LC = "torch_lc"  # PyTorch's _low_contention_all_gather (a reference)
    AUTO = "auto"          # the planner picks one of the above per workload

    def __str__(self) -> str:
        return self.value


class Partition(str, enum.Enum):
    """Which SM partition a strategy sweeps."""

    NCCL_CTAS = "nccl_ctas"  # GEMM in a green context without k SMs, NCCL capped to k CTAs
    GEMM_ONLY = "gemm_only"  # GEMM in a green context without k SMs (copy-engine collectives)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    impl: Mover
    comm_first: bool = False
    high_priority: bool = False
    partition: Partition | None = None
    # Collectives it can run (None: every registered one).
    collectives: tuple[str, ...] | None = None
    reference: bool = False  # an outside reference, not one of the paper's strategies

    @property
    def runtime_applies(self) -> bool:
        """The planner may pick it and ``conccl.overlap`` run it (NCCL or conccl; not the references)."""
        return self.impl in (Mover.NCCL, Mover.CONCCL)

    def runs(self, collective: str) -> bool:
        return self.collectives is None or collective in self.collectives

    def sweep(self, quick: bool) -> tuple[int, ...]:
        """SM counts the study tries (0: no partition)."""
        if self.partition is Partition.NCCL_CTAS:
            return RP_SMS_QUICK if quick else RP_SMS
        if self.partition is Partition.GEMM_ONLY:
            return CE_RP_SMS_QUICK if quick else CE_RP_SMS
        return (0,)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in [
    Strategy("c3_base", "NCCL collective, GEMM launched first", Mover.NCCL),
    Strategy("c3_sp", "schedule prioritization: NCCL collective launched first", Mover.NCCL, comm_first=True),
    Strategy("c3_sp_hp", "c3_sp with NCCL's stream at high priority", Mover.NCCL, comm_first=True, high_priority=True),
    Strategy("c3_rp", "resource partitioning: GEMM in a green context, NCCL capped to the reserved SMs as CTAs",
             Mover.NCCL, partition=Partition.NCCL_CTAS),
    Strategy("c3_sp_rp", "c3_sp and c3_rp together", Mover.NCCL, comm_first=True, partition=Partition.NCCL_CTAS),
    Strategy("conccl", "conccl copy-engine collective (no SM; a persistent op, agreed with the peers once), "
             "GEMM launched first", Mover.CONCCL),
    Strategy("conccl_rp", "conccl, and the GEMM gives up SMs (green context)", Mover.CONCCL,
             partition=Partition.GEMM_ONLY),
    Strategy("auto", "the planner's choice from the shipped hardware profile, run by conccl.overlap(plan='auto')",
             Mover.AUTO, reference=True),
    # PyTorch's op gathers only: the one strategy restricted to a collective.
    Strategy("torch_lc", "reference: PyTorch _low_contention_all_gather (copy engines + barrier kernel)",
             Mover.TORCH_LC, collectives=("all_gather",), reference=True),
]}

# The paper's strategies in its order; the others are extra rows.
PAPER_STRATEGIES = ("c3_base", "c3_sp", "c3_rp", "c3_sp_rp", "conccl", "conccl_rp")


def strategies_for(collective: str) -> list[Strategy]:
    return [s for s in STRATEGIES.values() if s.runs(collective)]


def runtime_strategies() -> list[str]:
    """Names ``conccl.overlap(plan=...)`` accepts besides ``"auto"``."""
    return [n for n, s in STRATEGIES.items() if s.runtime_applies]


def strategy_for(impl: str, comm_first: bool, high_priority: bool, partitioned: bool) -> str:
    """The name of the strategy a combination of knobs amounts to."""
    if Mover(impl) is Mover.CONCCL:
        return "conccl_rp" if partitioned else "conccl"
    if partitioned:
        return "c3_sp_rp" if comm_first else "c3_rp"
    if comm_first:
        return "c3_sp_hp" if high_priority else "c3_sp"
    return "c3_base"
