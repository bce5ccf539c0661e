"""The reference MoE dispatcher conccl.ep is compared with: built the way torchtitan's default
token dispatcher is, on ``torch.distributed`` (NCCL on GPUs, gloo on the CPU).

Transport as torchtitan's: the counts per expert by one ``all_to_all_single``, then every
(token, expert) pair's row by another (a token routed to two experts of one rank is sent
twice), sorted by global expert on the way out and regrouped by local expert on arrival.
Arithmetic as conccl.ep's (its module doc: per rank holding a token's experts, its slots in
order, ``w * y`` in fp32, rounded; the ranks in order in fp32, rounded once), so the two agree
bit for bit and a benchmark compares their transports. Forward only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..integrations.ep.layout import experts_per_rank


@dataclass
class ReferenceHandle:
    pg: object
    pairs: torch.Tensor  # [P, 2] (token, slot) of every routed pair, in send order
    dest: torch.Tensor  # [P] their ranks
    send_counts: list  # pairs to each rank
    recv_counts: list  # pairs from each rank
    regroup: torch.Tensor  # received order -> expert-major order
    tokens: int
    weights: torch.Tensor  # [T, k] fp32


def reference_dispatch(x, topk_idx, topk_weights, num_experts: int, pg=None):
    """``(expert_x, counts, handle)`` as :func:`conccl.ep.dispatch` returns them."""
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    epr = experts_per_rank(num_experts, world)
    idx = topk_idx.long()
    k = idx.shape[1]
    flat = idx.flatten()
    live = (flat >= 0).nonzero().flatten()
    order = torch.sort(flat[live], stable=True).indices  # by global expert, then (token, slot)
    pair_ids = live[order]
    experts = flat[pair_ids]
    pairs = torch.stack([pair_ids // k, pair_ids % k], dim=1)
    dest = experts // epr
    per_expert = torch.bincount(experts, minlength=num_experts).to(torch.int64)  # [world * epr]
    got = torch.empty_like(per_expert)
    dist.all_to_all_single(got, per_expert, group=pg)  # got[s * epr + e]: pairs from s for local expert e
    got = got.view(world, epr)
    send_counts = per_expert.view(world, epr).sum(dim=1).tolist()
    recv_counts = got.sum(dim=1).tolist()
    rows = torch.empty((sum(recv_counts), x.shape[1]), dtype=x.dtype, device=x.device)
    dist.all_to_all_single(rows, x[pairs[:, 0]].contiguous(), recv_counts, send_counts, group=pg)
    # arrived (source, expert, token, slot): regroup as (expert, source, token, slot)
    starts = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.int64), got.flatten()]), 0)[:-1].view(world, epr)
    regroup = torch.cat([torch.arange(int(starts[s, e]), int(starts[s, e] + got[s, e])) for e in range(epr)
                         for s in range(world)] or [torch.zeros(0, dtype=torch.int64)])
    weights = torch.ones(idx.shape) if topk_weights is None else topk_weights.float()
    handle = ReferenceHandle(pg, pairs, dest, send_counts, recv_counts, regroup, x.shape[0], weights)
    return rows[regroup], got.sum(dim=0).tolist(), handle


def reference_combine(expert_out, handle: ReferenceHandle):
    """``[T, H]`` as :func:`conccl.ep.combine` returns it."""
    h = handle
    back_order = torch.empty_like(h.regroup)
    back_order[h.regroup] = torch.arange(h.regroup.numel())
    y = torch.empty((sum(h.send_counts), expert_out.shape[1]), dtype=expert_out.dtype, device=expert_out.device)
    dist.all_to_all_single(y, expert_out[back_order].contiguous(), h.send_counts, h.recv_counts, group=h.pg)
    world = len(h.send_counts)
    k = h.weights.shape[1]
    total = torch.zeros((h.tokens, expert_out.shape[1]), dtype=torch.float32, device=expert_out.device)
    for d in range(world):
        part = torch.zeros_like(total)
        held = torch.zeros(h.tokens, dtype=torch.bool, device=expert_out.device)
        for j in range(k):
            sel = ((h.dest == d) & (h.pairs[:, 1] == j)).nonzero().flatten()
            t = h.pairs[sel, 0]
            part[t] = part[t] + h.weights[t, j, None] * y[sel].float()
            held[t] = True
        total[held] = total[held] + part[held].to(expert_out.dtype).float()
    return total.to(expert_out.dtype)
