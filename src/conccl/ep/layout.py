"""Where every token row of a MoE layer goes: the layouts of dispatch and combine, as pure
functions of the routing (no communication, any device).

Experts are numbered 0..E-1 and split evenly: expert ``g`` lives on rank ``g // (E / world)``
as its local expert ``g % (E / world)``. A rank's token ``t`` is *sent* once to every rank that
holds any of its top-k experts (a token routed to two experts of one rank crosses the link
once), in the order: destination rank, then token. The receiver *expands* what it received into
one row per (token, expert) slot, grouped by local expert, then by the order it received rows
in (source rank, then the source's token order), then by top-k slot: what a grouped GEMM
(``torch._grouped_mm``) reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SendLayout:
    """One rank's side of a dispatch: ``order`` (the token indices sent, destination-major),
    ``counts[d]`` (rows sent to rank ``d``), and per sent row the top-k slots that rank holds:
    ``slots`` [rows, k] its local expert there or -1, ``weights`` [rows, k] the slot's weight
    there or 0."""

    order: torch.Tensor
    counts: list
    slots: torch.Tensor
    weights: torch.Tensor


@dataclass(frozen=True)
class Expansion:
    """The receiver's side: ``rows`` [N] (the received row each expanded row copies), grouped
    by local expert with ``counts[e]`` rows each; ``position`` [received rows, k] where each
    (row, slot) landed in the expansion, or -1."""

    rows: torch.Tensor
    counts: list
    position: torch.Tensor


def experts_per_rank(num_experts: int, world: int) -> int:
    if num_experts <= 0 or num_experts % world:
        raise ValueError(f"{num_experts} experts do not split evenly over {world} ranks")
    return num_experts // world


@dataclass(frozen=True)
class Routing:
    """A rank's routing on its device, before the host knows any size (made with no
    device-to-host sync): ``order`` / ``dest`` [world * T] the (token, rank) pairs, those to be
    sent first (rank-major, then token); ``table`` [world, 1 + experts per rank] int64, per
    destination the rows sent there, then the (token, slot) pairs per its local expert; ``bad``
    [] int64 the slots naming an expert outside -1..E-1 (ignored in the rest)."""

    order: torch.Tensor
    dest: torch.Tensor
    table: torch.Tensor
    bad: torch.Tensor


def route(topk_idx: torch.Tensor, num_experts: int, world: int) -> Routing:
    """The :class:`Routing` of ``topk_idx`` [T, k] (expert numbers; -1: no expert)."""
    if topk_idx.dim() != 2:
        raise ValueError(f"topk_idx must be [tokens, k], got shape {tuple(topk_idx.shape)}")
    epr = experts_per_rank(num_experts, world)
    idx = topk_idx.long()
    tokens, dev = idx.shape[0], idx.device
    valid = (idx >= 0) & (idx < num_experts)
    bad = ((idx < -1) | (idx >= num_experts)).sum()
    owner = torch.where(valid, idx // epr, world)  # world: no rank
    # [T, world + 1] one-hot of the ranks a token goes to, by scatter (a mask index would sync)
    mine = torch.zeros((tokens, world + 1), dtype=torch.bool, device=dev).scatter_(1, owner, True)[:, :world]
    flat = mine.t().reshape(-1)  # rank-major, then token
    perm = torch.sort((~flat).to(torch.int8), stable=True).indices  # the sent pairs first, in order
    pairs = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev).scatter_add_(
        0, torch.where(valid, idx, num_experts).flatten(), torch.ones(idx.numel(), dtype=torch.int64, device=dev))
    table = torch.cat([mine.sum(dim=0)[:, None].to(torch.int64), pairs[:num_experts].view(world, epr)], dim=1)
    return Routing(perm % max(tokens, 1), perm // max(tokens, 1), table, bad)


def send_layout(routing: Routing, topk_idx: torch.Tensor, topk_weights: torch.Tensor | None, counts: list,
                num_experts: int) -> SendLayout:
    """The :class:`SendLayout` once the host knows ``counts`` (rows per destination, from
    ``routing.table[:, 0]``): no device-to-host sync."""
    world = len(counts)
    epr = experts_per_rank(num_experts, world)
    idx = topk_idx.long()
    weights = torch.ones(idx.shape, dtype=torch.float32, device=idx.device) if topk_weights is None \
        else topk_weights.float()
    rows = sum(counts)
    order, dest = routing.order[:rows], routing.dest[:rows]
    owner = torch.where((idx >= 0) & (idx < num_experts), idx // epr, -1)
    held = owner[order] == dest[:, None]  # [rows, k]: the slots the destination holds
    slots = torch.where(held, idx[order] % epr, torch.full_like(held, -1, dtype=idx.dtype))
    wts = torch.where(held, weights[order], torch.zeros((), dtype=weights.dtype, device=weights.device))
    return SendLayout(order, list(counts), slots.to(torch.int32), wts)


def plan_send(topk_idx: torch.Tensor, topk_weights: torch.Tensor | None, num_experts: int, world: int) -> SendLayout:
    """The send layout of a rank whose tokens picked ``topk_idx`` [T, k] (expert numbers; -1: no
    expert) with ``topk_weights`` [T, k] (None: ones). One device-to-host sync (the sizes)."""
    rt = route(topk_idx, num_experts, world)
    host = torch.cat([rt.bad.view(1), rt.table[:, 0]]).tolist()
    if host[0]:
        raise ValueError(f"topk_idx holds an expert outside -1..{num_experts - 1}")
    return send_layout(rt, topk_idx, topk_weights, host[1:], num_experts)


def rank_rows(counts: list, order: torch.Tensor, tokens: int) -> torch.Tensor:
    """[tokens, world] int64: each token's row among those a rank sent (rank-major: ``counts[d]``
    rows to rank d, tokens ``order``), or -1 where it sent none there. Combine's sums find what
    came back through it (the routing kernel writes it as it places the rows)."""
    world, rows = len(counts), order.shape[0]
    dest = torch.repeat_interleave(torch.arange(world, device=order.device),
                                   torch.tensor(counts, device=order.device), output_size=rows)
    index = torch.full((tokens * world,), -1, dtype=torch.int64, device=order.device)
    index[order * world + dest] = torch.arange(rows, device=order.device)
    return index.view(tokens, world)


def expansion_order(slots: torch.Tensor, local_experts: int):
    """``(rows [R * k], counts [local_experts] int64, position [R, k])`` of received rows whose
    slots (local expert or -1, [R, k]) are ``slots``, with no host sync: every (row, slot) pair
    by expert, then (row, slot) order (a stable sort), the valid pairs first; ``rows`` the
    received row of each, ``position`` where each landed or -1."""
    rows_n, k = slots.shape
    s = slots.long().flatten()  # (row, slot) pairs in row-major order: row, then slot
    key = torch.where((s >= 0) & (s < local_experts), s, local_experts)
    counts = torch.zeros(local_experts + 1, dtype=torch.int64, device=s.device).scatter_add_(
        0, key, torch.ones_like(key))[:local_experts]
    perm = torch.sort(key, stable=True).indices
    position = torch.empty_like(perm).scatter_(
        0, perm, torch.where(key[perm] < local_experts, torch.arange(perm.numel(), device=s.device), -1))
    return perm // max(k, 1), counts, position.view(rows_n, k)


def plan_expansion(slots: torch.Tensor, local_experts: int, counts: list | None = None) -> Expansion:
    """The expansion of received rows whose slots (local expert or -1, [rows, k]) are ``slots``.
    ``counts``: the pairs per local expert where the host knows them (no sync then)."""
    rows, per, position = expansion_order(slots, local_experts)
    counts = per.tolist() if counts is None else list(counts)
    return Expansion(rows[:sum(counts)], counts, position)
