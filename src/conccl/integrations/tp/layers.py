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
all-reduce).
"""
from __future__ import annotations

import torch

from .ops import all_gather_matmul, matmul_reduce_scatter


class _ColumnParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_shard, group, schedule, bwd_schedule, *weights):
        gathered, outs = all_gather_matmul(x_shard, [w.t() for w in weights], 0, group, schedule=schedule,
                                           return_gathered=True)
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
        dx = matmul_reduce_scatter(dy, w, 0, None, ctx.group, schedule=ctx.bwd_schedule)
        g2 = gathered.reshape(-1, gathered.shape[-1])
        dws = [g.reshape(-1, g.shape[-1]).t() @ g2 for g in grads]
        return (dx, None, None, None, *dws)


class _RowParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, group, schedule, bwd_schedule):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.bwd_schedule = group, bwd_schedule
        return matmul_reduce_scatter(x, weight.t(), 0, None, group, schedule=schedule)

    @staticmethod
    def backward(ctx, dy_shard):
        x, weight = ctx.saved_tensors
        dy, (dx,) = all_gather_matmul(dy_shard.contiguous(), [weight], 0, ctx.group, schedule=ctx.bwd_schedule,
                                      return_gathered=True)
        dw = dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return dx, dw, None, None, None


class ColumnParallelLinear(torch.nn.Module):
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
        outs = _ColumnParallel.apply(x, self.group, self.schedule, self.backward_schedule, *self.weights)
        return outs[0] if self.single else outs


class RowParallelLinear(torch.nn.Module):
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
        return _RowParallel.apply(x, self.weight, self.group, self.schedule, self.backward_schedule)
