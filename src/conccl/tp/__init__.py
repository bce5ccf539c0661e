"""Tensor parallelism on copy engines (``conccl.tp``): the collective that feeds a GEMM, or
that a GEMM feeds, pipelined with it.

- :func:`all_gather_matmul`: column-parallel (sequence-parallel input): all-gather, then GEMM,
  as PyTorch's ``torch.ops.symm_mem.fused_all_gather_matmul``;
- :func:`matmul_reduce_scatter`: row-parallel: GEMM, then reduce-scatter, as
  ``fused_matmul_reduce_scatter``;
- :class:`ColumnParallelLinear`, :class:`RowParallelLinear`: sequence-parallel layers whose
  forward and backward run these (:mod:`conccl.tp.layers`);
- ``torch.ops.conccl.all_gather_matmul`` / ``torch.ops.conccl.matmul_reduce_scatter``: the two
  as custom ops for ``torch.compile``, groups named by :func:`op_group`
  (:mod:`conccl.tp.compiled`);
- :func:`fused_all_gather_matmul`, :func:`fused_matmul_reduce_scatter`: PyTorch async-TP's
  ``torch.ops.symm_mem`` signatures (a group by its ``group_name``), for a one-line swap;
- :func:`parallelize_module`: a model's ``nn.Linear`` layers made column- or row-parallel in
  place, as ``torch.distributed.tensor.parallel``'s ``ColwiseParallel`` / ``RowwiseParallel``
  plan with sequence parallelism (:mod:`conccl.tp.parallelize`).

``schedule``: ``"auto"`` (the planner's choice from the hardware profile:
:mod:`conccl.planner.tp`), a name (``serial``, ``ring``, ``direct``, ``direct-p4-g2``, ...;
``push``, ``push-s2``: an all-gather's shards pushed from the inputs, no staging (a
GEMM+reduce-scatter runs them as ``direct``, already pushes);
:class:`conccl.schedule.pipeline.TPSchedule`) or a ``TPSchedule``.
"""
from ..schedule.pipeline import Order, TPSchedule
from .compiled import fused_all_gather_matmul, fused_matmul_reduce_scatter, op_group
from .layers import ColumnParallelLinear, RowParallelLinear
from .ops import all_gather_matmul, matmul_reduce_scatter, resolve_schedule
from .parallelize import parallelize_module

__all__ = ["all_gather_matmul", "matmul_reduce_scatter", "ColumnParallelLinear", "RowParallelLinear", "TPSchedule",
           "Order", "resolve_schedule", "op_group", "fused_all_gather_matmul", "fused_matmul_reduce_scatter",
           "parallelize_module"]
