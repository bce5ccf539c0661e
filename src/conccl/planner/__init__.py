"""The planner: which strategy and SM split a computation and a collective should run under.

Pure functions of a measured :class:`~conccl.planner.profile.HardwareProfile` and a workload
(GEMM shape, collective, size, world); :func:`plan` is the entry point.
"""
from .heuristics import (Kernel, candidates, copy_engine_sms, gemm_blocks, launch_order, plan, plan_auto,
                         plan_strategy, resource_partition, workload)
from .plan import Plan, PlanError
from .timing import Workload

__all__ = ["Plan", "PlanError", "Workload", "Kernel", "plan", "plan_auto", "plan_strategy", "candidates",
           "launch_order", "resource_partition", "copy_engine_sms", "gemm_blocks", "workload"]
