"""The reference MoE dispatcher conccl.ep is compared with: built the way torchtitan's default
token dispatcher is, on ``torch.distributed`` (NCCL on GPUs, gloo on the CPU).

Transport as torchtitan's: the counts per expert by one ``all_to_all_single``, then every
(token, expert) pair's row by another (a token routed to two experts of one rank is sent
twice), sorted by global expert on the way out and regrouped by local expert on arrival.
Arithmetic as conccl.ep's (its module doc: per rank holding a token's experts, its slots in
order, ``w * y`` in fp32, rounded; the ranks in order in fp32, rounded once), so the two agree
bit for bit and a benchmark compares their transports.

Differentiable both ways, with conccl.ep's backward arithmetic, so a training step agrees bit
for bit too:

- dispatch's backward: the pairs' gradient rows go back to the tokens' ranks (one
  ``all_to_all_single``) and are summed as combine sums, without weights;
- combine's backward: the token's gradient row goes to every pair's rank, the weights and
  top-k slots beside it as fp32 ``[pairs, 2]`` (two ``all_to_all_single``); there
  ``grad_out = (w * g)`` rounded to the dtype and ``grad_w = sum over H of g * y`` in fp32,
  one sum over all the expert-ordered rows, the call conccl.ep makes on the same rows in the
  same order (a GPU reduction's order depends on the row count); ``grad_w`` goes back by a third.

Where torchtitan sums a token's rows by ``scatter_add`` (atomics on GPUs: no fixed order),
this sums them as left folds planned once per dispatch (:func:`_plan_fold`: step ``i`` adds
every segment's ``i``-th row), the order conccl.ep's arithmetic states.

Host syncs: dispatch a few (the counts; the fold plans' sizes); combine and both backward
passes none. SM work on the caller's stream (sorts, gathers, the
folds' adds); workspace: fp32 copies of the pairs' rows, ``[pairs, H]``, and of the partials.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..ep.layout import experts_per_rank

__all__ = ["reference_dispatch", "reference_combine", "ReferenceHandle"]


@dataclass
class _Fold:
    """A left fold of rows into segments, planned once: step ``i`` adds, for every segment with
    more than ``i`` rows, its ``i``-th row (``steps[i] = (rows, segments)``, no segment twice).
    ``keys`` [segments]: the segments' keys, ascending."""

    steps: list
    segments: int
    keys: torch.Tensor


def _plan_fold(keys: torch.Tensor) -> _Fold:
    """Rows with key ``keys[i]`` [n] are summed per key in the order they come."""
    n = keys.numel()
    order = torch.sort(keys, stable=True).indices  # stable: a key's rows keep their order
    ks = keys[order]
    first = torch.ones(n, dtype=torch.bool, device=keys.device)
    first[1:] = ks[1:] != ks[:-1]
    seg = torch.cumsum(first, 0) - 1
    pos = torch.arange(n, device=keys.device)
    place = pos - torch.cummax(torch.where(first, pos, torch.zeros_like(pos)), 0).values
    by_place = torch.sort(place, stable=True).indices
    sizes = torch.bincount(place).tolist() if n else []
    steps, start = [], 0
    for m in sizes:
        sel = by_place[start:start + m]
        steps.append((order[sel], seg[sel]))
        start += m
    return _Fold(steps, sizes[0] if sizes else 0, ks[first])


def _run_fold(fold: _Fold, values: torch.Tensor) -> torch.Tensor:
    """[segments, H] fp32: ``values`` [n, H] (fp32) summed per segment from zero, in order."""
    acc = torch.zeros((fold.segments, *values.shape[1:]), dtype=torch.float32, device=values.device)
    for rows, seg in fold.steps:
        acc[seg] = acc[seg] + values[rows]
    return acc


@dataclass
class ReferenceHandle:
    pg: object
    pairs: torch.Tensor  # [P, 2] (token, slot) of every routed pair, in send order
    send_counts: list  # pairs to each rank
    recv_counts: list  # pairs from each rank
    regroup: torch.Tensor  # [R] received order -> expert-major order
    tokens: int
    weights: torch.Tensor  # [T, k] fp32, as dispatched (no autograd history)
    ungroup: torch.Tensor  # [R] expert-major order -> received order
    unsort: torch.Tensor  # [P] send order -> (token, slot) order
    pair_weights: torch.Tensor  # [P] fp32, (token, slot) order
    per_rank: _Fold  # (token, slot)-ordered pairs into (rank, token) partials
    per_token: _Fold  # (rank, token) partials into tokens


def _a2a(rows: torch.Tensor, send_counts: list, recv_counts: list, pg) -> torch.Tensor:
    out = torch.empty((sum(recv_counts), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    dist.all_to_all_single(out, rows.contiguous(), recv_counts, send_counts, group=pg)
    return out


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return inv


def _token_sum(h: ReferenceHandle, y: torch.Tensor, weighted: bool, dtype) -> torch.Tensor:
    """[T, H]: the pairs' rows ``y`` [P, H] (send order), per rank holding the token its slots
    in order (``w * y`` if ``weighted``) in fp32, rounded; then the ranks in order, rounded."""
    v = y[h.unsort].float()
    if weighted:
        v = h.pair_weights[:, None] * v
    part = _run_fold(h.per_rank, v).to(dtype).float()
    total = torch.zeros((h.tokens, *y.shape[1:]), dtype=torch.float32, device=y.device)
    total[h.per_token.keys] = _run_fold(h.per_token, part)
    return total.to(dtype)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h: ReferenceHandle):
        ctx.handle = h
        rows = _a2a(x[h.pairs[:, 0]], h.send_counts, h.recv_counts, h.pg)
        return rows[h.regroup]

    @staticmethod
    def backward(ctx, grad):
        h = ctx.handle
        g = _a2a(grad[h.ungroup], h.recv_counts, h.send_counts, h.pg)
        return _token_sum(h, g, False, grad.dtype), None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, expert_out, topk_weights, h: ReferenceHandle):
        ctx.handle = h
        ctx.save_for_backward(expert_out)
        y = _a2a(expert_out[h.ungroup], h.recv_counts, h.send_counts, h.pg)
        return _token_sum(h, y, True, expert_out.dtype)

    @staticmethod
    def backward(ctx, grad):
        h = ctx.handle
        (expert_out,) = ctx.saved_tensors
        tok, slot = h.pairs[:, 0], h.pairs[:, 1]
        g = _a2a(grad[tok], h.send_counts, h.recv_counts, h.pg)[h.regroup]  # [R, H], expert-major
        meta = torch.stack([h.weights[tok, slot], slot.float()], dim=1)
        meta = _a2a(meta, h.send_counts, h.recv_counts, h.pg)[h.regroup]
        grad_out = (meta[:, 0, None] * g.float()).to(expert_out.dtype)
        # one sum over H for all the expert's rows, in expert order (conccl.ep makes the same call)
        grad_w_pairs = (g.float() * expert_out.float()).sum(dim=-1)
        back = _a2a(grad_w_pairs[h.ungroup], h.recv_counts, h.send_counts, h.pg)  # collective: always
        if not ctx.needs_input_grad[1]:
            return grad_out, None, None
        grad_w = torch.zeros(h.weights.shape, dtype=torch.float32, device=grad.device)
        grad_w[tok, slot] = grad_w[tok, slot] + back
        return grad_out, grad_w, None


def reference_dispatch(x, topk_idx, topk_weights, num_experts: int, pg=None):
    """``(expert_x, counts, handle)`` as :func:`conccl.ep.dispatch` returns them: ``x`` [T, H]'s
    rows, one per (token, expert) pair of ``topk_idx`` [T, k] (-1: none), grouped by local
    expert (``counts[e]`` rows each), then source rank, token, slot. Differentiable in ``x``.
    ``topk_weights`` [T, k] (None: ones) are kept, detached, for :func:`reference_combine`.
    Collective over ``pg`` (default: the world)."""
    world = dist.get_world_size(pg)
    epr = experts_per_rank(num_experts, world)
    dev = x.device
    idx = topk_idx.long().to(dev)
    tokens, k = idx.shape
    flat = idx.flatten()
    live = (flat >= 0).nonzero().flatten()  # the pairs in (token, slot) order
    order = torch.sort(flat[live], stable=True).indices  # by global expert, then (token, slot)
    pair_ids = live[order]
    experts = flat[pair_ids]
    pairs = torch.stack([pair_ids // k, pair_ids % k], dim=1)
    per_expert = torch.bincount(experts, minlength=num_experts).to(torch.int64)  # [world * epr]
    got = torch.empty_like(per_expert)
    dist.all_to_all_single(got, per_expert, group=pg)  # got[s * epr + e]: pairs from s for local expert e
    host = torch.stack([per_expert, got]).view(2, world, epr).tolist()  # the sizes: a device-to-host sync
    send_counts, recv_counts = [sum(row) for row in host[0]], [sum(row) for row in host[1]]
    # arrived (source, expert, token, slot): regroup as (expert, source, token, slot)
    block = torch.arange(world * epr, device=dev)
    block = (block % epr) * world + block // epr  # (source, expert) block's place, expert-major
    regroup = torch.sort(torch.repeat_interleave(block, got, output_size=sum(recv_counts)), stable=True).indices
    weights = (torch.ones(idx.shape, device=dev) if topk_weights is None else topk_weights.detach().float()).to(dev)
    # combine's folds: (token, slot)-ordered pairs into (rank, token) partials, those into tokens
    per_rank = _plan_fold((live // k) + (flat[live] // epr) * tokens)
    per_token = _plan_fold(per_rank.keys % tokens) if tokens else per_rank
    handle = ReferenceHandle(pg, pairs, send_counts, recv_counts, regroup, tokens, weights,
                             _inverse(regroup), _inverse(order), weights.flatten()[live], per_rank, per_token)
    return _Dispatch.apply(x, handle), [sum(col) for col in zip(*host[1])], handle


def reference_combine(expert_out, handle: ReferenceHandle, topk_weights=None):
    """``[T, H]`` as :func:`conccl.ep.combine` returns it: the expert outputs ``expert_out``
    [N, H] (rows as :func:`reference_dispatch` returned them) times the dispatched weights,
    summed per token. Differentiable in ``expert_out``; pass the ``topk_weights`` given to
    dispatch for their gradient (fp32 [T, k]). Collective, as dispatch."""
    w = topk_weights if topk_weights is not None else torch.zeros(0)
    return _Combine.apply(expert_out, w, handle)


def scatter_add_combine(expert_out, handle: ReferenceHandle):
    """``[T, H]`` as torchtitan's combine makes it, for timing: the expert rows back by one
    ``all_to_all_single``, times their weights in fp32, rounded, and added into each token's
    row by ``scatter_add`` (atomics on GPUs: no fixed order, so not conccl.ep's bits; within
    rounding of them). Forward only."""
    h = handle
    y = _a2a(expert_out[h.ungroup], h.recv_counts, h.send_counts, h.pg)  # send order
    tok, slot = h.pairs[:, 0], h.pairs[:, 1]
    rows = (h.weights[tok, slot][:, None] * y.float()).to(expert_out.dtype)
    out = torch.zeros((h.tokens, expert_out.shape[1]), dtype=expert_out.dtype, device=expert_out.device)
    return out.index_add_(0, tok, rows)
