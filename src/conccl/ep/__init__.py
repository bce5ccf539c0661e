"""Expert parallelism: a MoE layer's dispatch and combine over one node's ranks.

``dispatch(x, topk_idx, topk_weights, num_experts)`` sends every token row once to each rank
holding one of its experts and returns, on every rank, the rows its local experts must process,
grouped by local expert (``counts[e]`` rows each: what ``torch._grouped_mm`` takes), and a
handle; ``combine(expert_out, handle)`` brings the expert outputs back and returns ``[T, H]``,
the weighted sum over each token's experts. Both are autograd functions: dispatch's backward
is a combine (unweighted) and combine's a dispatch (with the weights' gradient), so a training
step works. Layouts: :mod:`conccl.ep.layout`.

How it moves: dispatch makes a small table first (per destination: rows, pairs per local
expert, a bad-input flag), the host reads it (the one device-to-host sync per dispatch) and the
ranks swap tables on the group's host board (no device collective); then the token rows, with
their top-k slots and weights at each row's end, go by one call of conccl's uneven
``all_to_all_single`` (copy engines; two calls where a row's bytes are not a multiple of 4).
SM work, on the caller's stream: the routing, the packing of the sent rows and the expansion
into expert order (kernels on GPUs, :mod:`conccl.kernels.moe_route`; sorts, gathers and
scatters on the CPU), the gather of the expanded rows (memory-bound), and each weighted sum of
combine and of dispatch's backward (one kernel of at most half the SMs,
:mod:`conccl.kernels.gather_sum`; the torch form on the CPU). :func:`moe_layer`
(:mod:`.overlap`) runs a layer over micro-batches with this beside the expert GEMMs.

Arithmetic, alike on every path: a receiving rank sums its experts' outputs for a token in
top-k slot order in fp32, weights first (``w * y``), and rounds the partial to the dtype; the
token's rank sums the partials of the ranks in rank order in fp32 and rounds once.

Status: CPU-tested over the reference executor (tests/multiproc/test_ep.py) and against the
NCCL reference dispatcher on GPUs (tests/gpu/test_gpu_ep.py); speed: ``conccl bench moe``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..collectives.all_to_all import ALL_TO_ALL
from .layout import Expansion, SendLayout, experts_per_rank, plan_expansion, plan_send, route, send_layout

__all__ = ["dispatch", "combine", "moe_layer", "DispatchHandle", "plan_send", "plan_expansion", "graph_workspace_bytes"]


@dataclass
class DispatchHandle:
    """What combine (and the backward passes) need of a dispatch: both layouts, the rows'
    counts each way and the weights as the experts' ranks received them."""

    group: object
    send: SendLayout
    recv_counts: list  # rows received from each rank
    expansion: Expansion | None  # set when the rows arrive
    recv_weights: torch.Tensor | None  # [received rows, k], set then too
    tokens: int
    rank_index: torch.Tensor | None = None  # GPUs: [tokens, world], each token's row among those sent to a rank, or -1
    fixed: bool = False  # fixed sizes (:mod:`.fixed`): counts on the device, blocks of ``tokens`` rows per rank
    bad_input: torch.Tensor | None = None  # fixed sizes: [] int64 on the device, 1 where a slot named no expert

    @property
    def counts(self):
        """Expanded rows per local expert: a list, or with fixed sizes an int32 tensor on the
        device (None before the rows arrive)."""
        return None if self.expansion is None else self.expansion.counts


def _group(group):
    if group is not None and hasattr(group, "call"):
        return group  # a conccl Group (or the CPU reference's)
    from ..api import get_group

    return get_group(group)


def _exchange(g, rows: torch.Tensor, send_counts: list, recv_counts: list) -> torch.Tensor:
    """``rows`` sent ``send_counts[d]`` to rank d (in order), received ``recv_counts[s]`` from s."""
    out = torch.empty((sum(recv_counts), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    g.call(ALL_TO_ALL, out, rows.contiguous(), (list(recv_counts), list(send_counts)))
    return out


def _kernel(t: torch.Tensor) -> bool:
    """Whether the gathered-sum kernel (conccl.kernels.gather_sum) does a sum on ``t``."""
    return t.is_cuda and t.dtype in (torch.float32, torch.bfloat16, torch.float16) and t.dim() == 2


def _rank_sum(returned: torch.Tensor, send: SendLayout, tokens: int, dtype, rank_index=None) -> torch.Tensor:
    """[tokens, H]: each token's returned rows summed over ranks in rank order, fp32, rounded once."""
    if _kernel(returned) and rank_index is not None:
        from ..kernels.gather_sum import gather_sum

        out = torch.empty((tokens, returned.shape[1]), dtype=dtype, device=returned.device)
        return gather_sum(out, returned.contiguous(), rank_index)
    acc = torch.zeros((tokens, *returned.shape[1:]), dtype=torch.float32, device=returned.device)
    if rank_index is not None:  # the kernel's arithmetic in torch: + each rank's row where it sent one
        for d in range(rank_index.shape[1]):
            at = rank_index[:, d]
            row = returned[at.clamp(min=0)].float()
            acc = acc + torch.where((at >= 0).view(-1, *[1] * (row.dim() - 1)), row, torch.zeros_like(row))
        return acc.to(dtype)
    start = 0
    for n in send.counts:  # one row per token per rank: no index repeats within a rank's rows
        idx = send.order[start:start + n]
        acc[idx] = acc[idx] + returned[start:start + n].float()
        start += n
    return acc.to(dtype)


def _slot_sum(values: torch.Tensor, position: torch.Tensor, weights: torch.Tensor | None, dtype) -> torch.Tensor:
    """[received rows, H]: per received row, its slots' expanded rows (times their weights) summed
    in slot order, fp32, rounded to ``dtype`` once."""
    if _kernel(values) and values.dtype == dtype:
        from ..kernels.gather_sum import gather_sum

        out = torch.empty((position.shape[0], values.shape[1]), dtype=dtype, device=values.device)
        return gather_sum(out, values.contiguous(), position.contiguous(),
                          None if weights is None else weights.contiguous())
    acc = torch.zeros((position.shape[0], *values.shape[1:]), dtype=torch.float32, device=values.device)
    for j in range(position.shape[1]):
        pos = position[:, j]
        has = pos >= 0  # (no early exit on has.any(): a device-to-host sync per slot)
        v = values[pos.clamp(min=0)].float()
        if weights is not None:
            v = weights[:, j, None] * v
        acc = acc + torch.where(has[:, None], v, torch.zeros_like(v))
    return acc.to(dtype)


def _receive(h: "DispatchHandle", x: torch.Tensor, meta: torch.Tensor):
    """Send this rank's rows (``x[order]``) and their slots and weights (``meta`` int32 [rows, 2k])
    to their ranks; return (the received rows [R, H], their meta [R, 2k]). One call where a row's
    bytes keep the meta 4-byte aligned (the meta rides at the end of each row), else two."""
    row_bytes = x.shape[1] * x.element_size()
    if row_bytes % 4:
        return (_exchange(h.group, x[h.send.order], h.send.counts, h.recv_counts),
                _exchange(h.group, meta, h.send.counts, h.recv_counts))
    from ..kernels.moe_route import pack, packable  # (no CUDA needed to import)

    meta = meta.contiguous()
    if packable(x, h.send.order, meta):  # gather and concatenation in one kernel
        packed = pack(x, h.send.order, meta)
    else:
        packed = torch.cat([x[h.send.order].view(torch.uint8), meta.view(torch.uint8)], dim=1)
    got = _exchange(h.group, packed, h.send.counts, h.recv_counts)
    return got[:, :row_bytes].view(x.dtype), got[:, row_bytes:].view(torch.int32)


def _expand(slots: torch.Tensor, local_experts: int, counts: list | None) -> Expansion:
    """The expansion of received rows: the counting-sort kernel on GPUs, the torch form else.
    ``counts`` None: fixed sizes (no host sync, room for the worst case: :mod:`.fixed`)."""
    if counts is None:
        from .fixed import expand_fixed

        return Expansion(*expand_fixed(slots, local_experts))
    if slots.is_cuda:
        from ..kernels.moe_route import MAX_EXPAND_EXPERTS, expand

        if local_experts <= MAX_EXPAND_EXPERTS:
            position, rows = expand(slots, local_experts, sum(counts))
            return Expansion(rows, list(counts), position)
    return plan_expansion(slots, local_experts, counts)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, handle: DispatchHandle, meta, local_experts: int, expert_counts: list):
        ctx.handle = h = handle
        received, rmeta = _receive(h, x.contiguous(), meta)
        k = meta.shape[1] // 2
        h.recv_weights = rmeta[:, k:].contiguous().view(torch.float32)
        h.expansion = _expand(rmeta[:, :k], local_experts, expert_counts)
        return received[h.expansion.rows]

    @staticmethod
    def backward(ctx, grad):
        h = ctx.handle
        per_row = _slot_sum(grad, h.expansion.position, None, grad.dtype)
        returned = _exchange(h.group, per_row, h.recv_counts, h.send.counts)
        return _rank_sum(returned, h.send, h.tokens, grad.dtype, h.rank_index), None, None, None, None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_out, topk_weights, handle: DispatchHandle):
        ctx.handle = handle
        ctx.save_for_backward(expert_out)
        h = handle
        partial = _slot_sum(expert_out, h.expansion.position, h.recv_weights, expert_out.dtype)
        returned = _exchange(h.group, partial, h.recv_counts, h.send.counts)
        return _rank_sum(returned, h.send, h.tokens, expert_out.dtype, h.rank_index)

    @staticmethod
    def backward(ctx, grad):
        h = ctx.handle
        (expert_out,) = ctx.saved_tensors
        g_rows = _exchange(h.group, grad[h.send.order], h.send.counts, h.recv_counts)  # [received rows, H]
        pos, rows_e = h.expansion.position, h.expansion.rows
        n, k = expert_out.shape[0], pos.shape[1]
        valid = pos >= 0
        # each expanded row's slot, scattered from the positions (the unused ones to a spare entry):
        # no mask index, so no device-to-host sync
        # (zeros: with fixed sizes the rows past the counts have no slot)
        slot_e = torch.zeros(n + 1, dtype=torch.int64, device=pos.device).scatter_(
            0, torch.where(valid, pos, n).flatten(), torch.arange(k, device=pos.device).repeat(pos.shape[0]))[:n]
        g = g_rows[rows_e].float()  # [N, H], expert order
        grad_out = (h.recv_weights[rows_e, slot_e][:, None] * g).to(expert_out.dtype)
        if h.fixed:  # rows past the counts are room, not tokens: no gradient
            real = torch.arange(n, device=pos.device) < h.counts.sum()
            grad_out = torch.where(real[:, None], grad_out, torch.zeros((), dtype=grad_out.dtype, device=pos.device))
        # the weights' gradient: one sum over H for all expanded rows (the reference makes the same call)
        grad_w_e = (g * expert_out.float()).sum(dim=-1)
        grad_w_rows = (torch.where(valid, grad_w_e[pos.clamp(min=0)], 0.0) if n
                       else torch.zeros(pos.shape, dtype=torch.float32, device=pos.device))
        # the weights' gradient goes back to the token's rank, slot by slot
        back = _exchange(h.group, grad_w_rows, h.recv_counts, h.send.counts)  # collective: always
        if not ctx.needs_input_grad[1]:
            return grad_out, None, None
        # a token's slots are each held by one rank: a scatter, then + 0 as the sum from zero makes -0 (+0)
        tokens = h.tokens
        held = h.send.slots >= 0
        at = torch.where(held, h.send.order[:, None] * k + torch.arange(k, device=held.device), tokens * k)
        grad_w = torch.zeros(tokens * k + 1, dtype=torch.float32, device=grad.device).scatter_(
            0, at.flatten(), back.flatten())[:tokens * k].view(tokens, k) + 0.0
        return grad_out, grad_w, None


def _problem(x, topk_idx, topk_weights) -> str | None:
    """What is wrong with one rank's inputs, found on the host (no sync), or None."""
    if x.dim() != 2:
        return f"x must be [tokens, hidden], got shape {tuple(x.shape)}"
    if topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
        return f"topk_idx must be [tokens, k] with x's {x.shape[0]} tokens, got shape {tuple(topk_idx.shape)}"
    if topk_idx.dtype.is_floating_point or topk_idx.dtype == torch.bool:
        return f"topk_idx must hold integers, got {topk_idx.dtype}"
    if topk_weights is not None and tuple(topk_weights.shape) != tuple(topk_idx.shape):
        return f"topk_weights must be shaped as topk_idx {tuple(topk_idx.shape)}, got {tuple(topk_weights.shape)}"
    if topk_idx.device != x.device or (topk_weights is not None and topk_weights.device != x.device):
        return f"x, topk_idx and topk_weights must be on one device (x on {x.device})"
    return None


def dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None, num_experts: int,
             group=None, *, fixed_sizes: bool = False):
    """Send ``x`` [T, H]'s rows to the ranks of their experts (``topk_idx`` [T, k], -1: none;
    ``topk_weights`` [T, k] or None) and return ``(expert_x, counts, handle)``: ``expert_x``
    [N, H] the rows this rank's ``num_experts / world`` local experts process, grouped by local
    expert with ``counts[e]`` rows each (a token routed to two of them is sent once and appears
    in both groups). Differentiable in ``x``. ``group``: a conccl Group or a process group
    (default: the world). Collective: every rank calls it, in the same order.

    One device-to-host sync (the sizes, after the first exchange). Bad input on any rank (a
    shape, an expert outside -1..E-1) raises ValueError on every rank, after that exchange, so
    no rank is left waiting.

    ``fixed_sizes=True``: no device-to-host sync, so the call captures into a CUDA graph: every
    rank sends every rank ``T`` rows (the rows not routed there are padding), ``expert_x`` has
    room for the worst case (``world * T * k`` rows, the first ``counts.sum()``
    the tokens) and ``counts`` is an int32 tensor on the device. Every rank passes the same T,
    k, H, dtype and E. Expert ids outside -1..E-1 are ignored and flagged in
    ``handle.bad_input`` (a device tensor), not raised. Costs and layout: :mod:`.fixed`."""
    g = _group(group)
    world = g.world
    problem = _problem(x, topk_idx, topk_weights)
    if fixed_sizes:
        return _dispatch_fixed(g, x, topk_idx, topk_weights, num_experts, problem)
    epr = experts_per_rank(num_experts, world)
    routed = None  # the routing kernel's (order, meta) on GPUs
    if problem is None and x.is_cuda:
        from ..kernels.moe_route import route as route_kernel

        table, order_all, meta_all, rank_row = route_kernel(topk_idx, topk_weights, num_experts, world)
        routed = order_all, meta_all, rank_row
    elif problem is None:
        rt = route(topk_idx, num_experts, world)
        table = torch.cat([rt.table, rt.bad.clamp(max=1).expand(world, 1)], dim=1)
    else:
        table = torch.zeros((world, epr + 2), dtype=torch.int64, device=x.device)
        table[:, -1] = 1
    # per destination: rows, pairs per its local expert, a "bad input" flag. The host needs the
    # sizes anyway: its own table comes to it (the one device-to-host sync) and the ranks swap
    # tables on the host board, with no device collective. The expert count first: ranks that
    # disagree on it stop alike.
    mine = table.flatten().tolist()
    every = g.exchange_values([num_experts] + mine, "conccl.ep.dispatch")
    if any(v[0] != num_experts for v in every):
        raise ValueError(f"conccl.ep.dispatch: the ranks passed different num_experts "
                         f"({sorted({v[0] for v in every})})")
    width = epr + 2
    send_counts = [mine[d * width] for d in range(world)]
    recv = [every[s][1 + g.rank * width:1 + (g.rank + 1) * width] for s in range(world)]  # what s sends here
    bad_ranks = [s for s in range(world) if recv[s][-1]]
    if bad_ranks:
        raise ValueError(problem or f"rank(s) {bad_ranks} called conccl.ep.dispatch with bad input "
                         f"(a shape, or an expert outside -1..{num_experts - 1}); every rank stops here")
    recv_counts = [recv[s][0] for s in range(world)]
    expert_counts = [sum(recv[s][1 + e] for s in range(world)) for e in range(epr)]
    # the rows' slots and weights travel with them: int32 [rows, 2k], the weights' fp32 bits after the slots
    if routed is not None:
        rows = sum(send_counts)
        order, meta = routed[0][:rows], routed[1][:rows]
        k = topk_idx.shape[1]
        send = SendLayout(order, send_counts, meta[:, :k], meta[:, k:].view(torch.float32))
    else:
        send = send_layout(rt, topk_idx, topk_weights, send_counts, num_experts)
        meta = torch.cat([send.slots, send.weights.contiguous().view(torch.int32)], dim=1)
    rank_index = routed[2] if routed is not None else None  # each token's sent row per rank (GPUs)
    handle = DispatchHandle(g, send, recv_counts, None, None, x.shape[0], rank_index)
    expert_x = _Dispatch.apply(x, handle, meta, epr, expert_counts)
    return expert_x, handle.counts, handle


def _dispatch_fixed(g, x, topk_idx, topk_weights, num_experts: int, problem):
    from .fixed import agree_fixed, fixed_layout

    agree_fixed(g, x, topk_idx, topk_weights, num_experts, problem)
    send, meta, rank_index, bad = fixed_layout(g, x, topk_idx, topk_weights, num_experts)
    tokens = x.shape[0]
    handle = DispatchHandle(g, send, [tokens] * g.world, None, None, tokens, rank_index, fixed=True, bad_input=bad)
    expert_x = _Dispatch.apply(x, handle, meta, experts_per_rank(num_experts, g.world), None)
    return expert_x, handle.counts, handle


def combine(expert_out: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None = None):
    """The tokens' outputs ``[T, H]`` on their own ranks: each token's expert outputs
    (``expert_out`` [N, H], rows as :func:`dispatch` returned them) times their weights, summed
    (module doc: the order). Pass the ``topk_weights`` given to dispatch for their gradient
    (they are used as dispatch sent them either way). Collective, as dispatch. An
    ``expert_out`` whose rows are not dispatch's raises ValueError on this rank before anything
    moves (the peers' combine then waits for the group's timeout)."""
    w = topk_weights if topk_weights is not None else torch.zeros(0)
    if handle.expansion is not None and expert_out.shape[0] != handle.expansion.rows.numel():
        # (a kernel would read past a shorter one; with fixed sizes it is the worst case's rows)
        raise ValueError(f"conccl.ep.combine: expert_out has {expert_out.shape[0]} rows, dispatch returned "
                         f"{handle.expansion.rows.numel()}")
    return _Combine.apply(expert_out, w, handle)


from .fixed import graph_workspace_bytes  # noqa: E402
from .overlap import moe_layer  # noqa: E402 - uses dispatch and combine above
