"""Sequence-parallel linear layers whose collectives are pipelined with their GEMMs.

Megatron-LM's sequence parallelism: between tensor-parallel blocks the activations are split
along the sequence (rows); a column-parallel layer gathers them and multiplies by its column
shard of the weight, a row-parallel layer multiplies its input (split along features) by its
row shard and reduce-scatters the product back to sequence shards. Forward and backward are
each other's mirror:

============================  ================================  ==================================
layer                         forward                           backward (input gradient)
============================  ================================  ==================================
:class:`ColumnParallelLinear`  all-gather + GEMM                 GEMM + reduce-scatter
:class:`RowParallelLinear`     GEMM + reduce-scatter             all-gather + GEMM
============================  ================================  ==================================

and the weight gradient is one more GEMM over the gathered rows (kept from the forward in the
column layer, gathered by the backward's own pipeline in the row layer). Weights are stored as
``torch.nn.Linear``'s, ``[out_features, in_features]`` per rank shard; no bias (Llama-style
blocks have none; a sequence-parallel row layer's bias gradient would need one more
all-reduce). Under ``torch.compile`` they trace their collectives as custom ops
(:mod:`conccl.tp.compiled`): no graph break.
"""
from __future__ import annotations

import torch

from .compiled import _group, op_group, schedule_name
from .ops import all_gather_matmul, matmul_reduce_scatter


def _traced(t) -> bool:
    """Whether ``t`` is being traced (torch.compile, export: fake or functional tensors): the
    ops then go through their custom ops (:mod:`conccl.tp.compiled`), which trace
    as single nodes; eager, the Python ops, without a custom op's dispatch."""
    return torch.compiler.is_compiling() or type(t) not in (torch.Tensor, torch.nn.Parameter)


def _ag_mm(x, weights, group: str, schedule: str):
    """(gathered x, [gathered x @ w for w in weights]) over the group named ``group``."""
    if _traced(x):
        res = torch.ops.conccl.all_gather_matmul(x, weights, 0, group, schedule, True)
        return res[0], res[1:]
    return all_gather_matmul(x, weights, 0, _group(group), schedule=schedule, return_gathered=True)


def _mm_rs(x, weight, group: str, schedule: str):
    if _traced(x):
        return torch.ops.conccl.matmul_reduce_scatter(x, weight, 0, group, schedule, "sum")
    return matmul_reduce_scatter(x, weight, 0, None, _group(group), schedule=schedule)


# Group and schedules travel by name (strings): what torch.compile traces through an
# autograd.Function's arguments and what the custom ops take.
class _ColumnParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_shard, group: str, schedule: str, bwd_schedule: str, *weights):
        gathered, outs = _ag_mm(x_shard, [w.t() for w in weights], group, schedule)
        ctx.save_for_backward(gathered, *weights)
        ctx.group, ctx.bwd_schedule = group, bwd_schedule
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        gathered, *weights = ctx.saved_tensors
        grads = [g.contiguous() for g in grads]
        # dX = sum_i dY_i @ W_i, reduce-scattered back to sequence shards: one pipeline over the
        # weights stacked along K (dY_i side by side times [W_1; W_2; ...]).
        dy = grads[0] if len(grads) == 1 else torch.cat(grads, dim=-1)
        w = weights[0] if len(weights) == 1 else torch.cat(weights, dim=0)
        dx = _mm_rs(dy, w, ctx.group, ctx.bwd_schedule)
        g2 = gathered.reshape(-1, gathered.shape[-1])
        dws = [g.reshape(-1, g.shape[-1]).t() @ g2 for g in grads]
        return (dx, None, None, None, *dws)


class _RowParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, group: str, schedule: str, bwd_schedule: str):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.bwd_schedule = group, bwd_schedule
        return _mm_rs(x, weight.t(), group, schedule)

    @staticmethod
    def backward(ctx, dy_shard):
        x, weight = ctx.saved_tensors
        dy, (dx,) = _ag_mm(dy_shard.contiguous(), [weight], ctx.group, ctx.bwd_schedule)
        dw = dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return dx, dw, None, None, None


class _Named(torch.nn.Module):
    """``group``, ``schedule`` and ``backward_schedule`` kept with the names the autograd
    functions take (``_names``), made when one is set (not in ``forward``, which torch.compile
    traces)."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in ("group", "schedule", "backward_schedule") and all(
                hasattr(self, n) for n in ("group", "schedule", "backward_schedule")):
            object.__setattr__(self, "_names", (op_group(self.group), schedule_name(self.schedule),
                                                schedule_name(self.backward_schedule)))


class ColumnParallelLinear(_Named):
    """``y = x @ W.T`` with ``x`` split along its rows (sequence) over the group and ``W``'s
    output features split over it: input ``[s / world, ..., in_features]`` on every rank,
    output ``[s, ..., out_features / world]`` (one per entry when ``out_features`` is a tuple:
    several projections, e.g. gate and up, share one all-gather).

    ``schedule``, ``backward_schedule``: as :func:`conccl.tp.all_gather_matmul`'s (forward) and
    :func:`conccl.tp.matmul_reduce_scatter`'s (backward); "auto" by default.
    """

    def __init__(self, in_features: int, out_features, group=None, *, schedule="auto",
                 backward_schedule="auto", world_size: int, device=None, dtype=None):
        super().__init__()
        outs = (out_features,) if isinstance(out_features, int) else tuple(out_features)
        if any(n % world_size for n in outs):
            raise ValueError(f"out_features {outs} must be divisible by the world size {world_size}")
        self.group, self.schedule, self.backward_schedule = group, schedule, backward_schedule
        self.single = isinstance(out_features, int)
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.empty(n // world_size, in_features, device=device, dtype=dtype)) for n in outs)

    def forward(self, x):
        # Indexed, not unpacked: torch.compile (dynamo of PyTorch 2.11) cannot unpack a
        # ParameterList with ``*`` (NotImplementedError in unpack_var_sequence); indexing it traces.
        weights = [self.weights[i] for i in range(len(self.weights))]
        outs = _ColumnParallel.apply(x, *self._names, *weights)
        return outs[0] if self.single else outs


class RowParallelLinear(_Named):
    """``y = x @ W.T`` with ``x``'s and ``W``'s input features split over the group, the result
    reduce-scattered along its rows: input ``[s, ..., in_features / world]``, output
    ``[s / world, ..., out_features]``."""

    def __init__(self, in_features: int, out_features: int, group=None, *, schedule="auto",
                 backward_schedule="auto", world_size: int, device=None, dtype=None):
        super().__init__()
        if in_features % world_size:
            raise ValueError(f"in_features {in_features} must be divisible by the world size {world_size}")
        self.group, self.schedule, self.backward_schedule = group, schedule, backward_schedule
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features // world_size, device=device,
                                                     dtype=dtype))

    def forward(self, x):
        return _RowParallel.apply(x, self.weight, *self._names)
