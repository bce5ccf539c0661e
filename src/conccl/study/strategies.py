"""The strategies a study measures, one registry shared by the measurement, the model, the
report and the planner. A strategy says how a GEMM and a collective run together:
which collective implementation, which is launched first, the collective stream's priority,
and which SM partitions are tried (the best of the sweep is the strategy's figure)."""
from __future__ import annotations

from dataclasses import dataclass

# SMs reserved for the collective in resource-partitioning sweeps (powers of two, as the
# paper swept CUs). The GEMM runs in a green context holding the rest.
RP_SMS = (8, 16, 32)
RP_SMS_QUICK = (16,)
# SMs a GEMM gives up beside copy-engine collectives (the paper's ConCCL_rp took 8 CUs).
CE_RP_SMS = (8, 16)
CE_RP_SMS_QUICK = (8,)


@dataclass(frozen=True)
class Strategy:
    name: str
    description: str
    impl: str  # "nccl" (SM kernels), "conccl" (copy engines), "torch_lc", "auto" (the planner picks)
    comm_first: bool = False
    high_priority: bool = False
    partition: str | None = None  # None, "nccl_ctas" (GEMM green context + NCCL max_ctas), "gemm_only"
    collectives: tuple[str, ...] = ("all_gather", "all_to_all")
    reference: bool = False  # an outside reference, not one of the paper's strategies

    @property
    def runtime_applies(self) -> bool:
        """The planner may pick it and ``conccl.overlap`` run it (NCCL or conccl; not the references)."""
        return self.impl in ("nccl", "conccl")

    def sweep(self, quick: bool) -> tuple[int, ...]:
        if self.partition == "nccl_ctas":
            return RP_SMS_QUICK if quick else RP_SMS
        if self.partition == "gemm_only":
            return CE_RP_SMS_QUICK if quick else CE_RP_SMS
        return (0,)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in [
    Strategy("c3_base", "NCCL collective, GEMM launched first", "nccl"),
    Strategy("c3_sp", "schedule prioritization: NCCL collective launched first", "nccl", comm_first=True),
    Strategy("c3_sp_hp", "c3_sp with NCCL's stream at high priority", "nccl", comm_first=True, high_priority=True),
    Strategy("c3_rp", "resource partitioning: GEMM in a green context, NCCL capped to the reserved SMs as CTAs",
             "nccl", partition="nccl_ctas"),
    Strategy("c3_sp_rp", "c3_sp and c3_rp together", "nccl", comm_first=True, partition="nccl_ctas"),
    Strategy("conccl", "conccl copy-engine collective (no SM; a persistent op, agreed with the peers once), "
             "GEMM launched first", "conccl"),
    Strategy("conccl_rp", "conccl, and the GEMM gives up SMs (green context)", "conccl", partition="gemm_only"),
    Strategy("auto", "the planner's choice from the shipped hardware profile, run by conccl.overlap(plan='auto')",
             "auto", reference=True),
    Strategy("torch_lc", "reference: PyTorch _low_contention_all_gather (copy engines + barrier kernel)",
             "torch_lc", collectives=("all_gather",), reference=True),
]}

# The paper's strategies in its order; the others are extra rows.
PAPER_STRATEGIES = ("c3_base", "c3_sp", "c3_rp", "c3_sp_rp", "conccl", "conccl_rp")


def strategies_for(collective: str) -> list[Strategy]:
    return [s for s in STRATEGIES.values() if collective in s.collectives]
