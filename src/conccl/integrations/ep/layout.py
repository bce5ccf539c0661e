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


def plan_send(topk_idx: torch.Tensor, topk_weights: torch.Tensor | None, num_experts: int, world: int) -> SendLayout:
    """The send layout of a rank whose tokens picked ``topk_idx`` [T, k] (expert numbers; -1: no
    expert) with ``topk_weights`` [T, k] (None: ones)."""
    if topk_idx.dim() != 2:
        raise ValueError(f"topk_idx must be [tokens, k], got shape {tuple(topk_idx.shape)}")
    epr = experts_per_rank(num_experts, world)
    idx = topk_idx.long()
    if ((idx < -1) | (idx >= num_experts)).any():
        raise ValueError(f"topk_idx holds an expert outside -1..{num_experts - 1}")
    weights = torch.ones(idx.shape, dtype=torch.float32, device=idx.device) if topk_weights is None \
        else topk_weights.float()
    owner = torch.where(idx >= 0, idx // epr, torch.full_like(idx, -1))  # [T, k]
    tokens = idx.shape[0]
    # (rank, token) pairs with any slot there, destination-major and token-ascending: one
    # nonzero over a [world, T] mask instead of one per rank
    mine = torch.zeros((world, tokens), dtype=torch.bool, device=idx.device)
    live = owner >= 0
    token_of = torch.arange(tokens, device=idx.device)[:, None].expand_as(owner)
    mine[owner[live], token_of[live]] = True
    dest, order = mine.nonzero(as_tuple=True)
    counts = torch.bincount(dest, minlength=world).tolist() if dest.numel() else [0] * world
    held = owner[order] == dest[:, None]  # [rows, k]: the slots the destination holds
    slots = torch.where(held, idx[order] % epr, torch.full_like(held, -1, dtype=idx.dtype))
    wts = torch.where(held, weights[order], torch.zeros((), dtype=weights.dtype, device=weights.device))
    return SendLayout(order, counts, slots.to(torch.int32), wts)


def plan_expansion(slots: torch.Tensor, local_experts: int) -> Expansion:
    """The expansion of received rows whose slots (local expert or -1, [rows, k]) are ``slots``."""
    rows_n, k = slots.shape
    s = slots.long()
    flat = s.flatten()  # (row, slot) pairs in row-major order: row, then slot
    pairs = (flat >= 0).nonzero().flatten()
    experts = flat[pairs]
    # group by expert, keeping (row, slot) order within it: a stable sort
    order = torch.sort(experts, stable=True).indices
    pairs = pairs[order]
    counts = torch.bincount(experts, minlength=local_experts).tolist() if experts.numel() else [0] * local_experts
    position = torch.full((rows_n * k,), -1, dtype=torch.long, device=slots.device)
    position[pairs] = torch.arange(pairs.numel(), device=slots.device)
    return Expansion(pairs // max(k, 1), counts, position.view(rows_n, k))
