"""conccl.ep with fixed sizes: a dispatch and combine whose every size is known on the host
before the routing is, so nothing waits for the device and the pair captures into a CUDA graph
(decode runs as one), replayed with new tokens and a new routing each time.

What it costs: every rank sends every rank a block of ``T`` rows (its token count: the most it
can send one rank, a token going to each rank at most once), the rows it does not fill being
padding the receiver ignores; the expert-grouped output has room for the worst case,
``world * T * k`` rows (a token's k slots may name one expert twice), of which the first ``counts.sum()`` are the
tokens (``counts``: pairs per local expert, int32 on the device: what ``torch._grouped_mm``'s
``offs`` is the cumulative sum of). So a dispatch moves ``world * T`` rows each way whatever the
routing (the normal mode moves only the rows routed: ~0.79 T per peer at 8 experts top-2 over
2 ranks), and the receiver's buffers are the worst case's. The layouts are the normal mode's
kernels with fixed block offsets (:func:`conccl.kernels.moe_route.route`'s ``block``).

What stays on the host: one rendezvous on the group's host board when the call is made (eager
or while capturing; not at a replay) that checks every rank passed the same token count, k,
hidden size, dtype and expert count, and that no rank's shapes are wrong, so bad input raises
on every rank instead of leaving peers waiting. Expert ids outside -1..E-1 cannot be checked
on the host without a sync: their slots are ignored, and ``handle.bad_input`` (a device
tensor, 1 where any of this rank's slots named one) says so.
"""
from __future__ import annotations

import zlib

import torch

from .layout import SendLayout, expansion_order, experts_per_rank, route, send_layout


def fixed_layout(g, x, topk_idx, topk_weights, num_experts: int):
    """``(send, meta, rank_index, bad)`` of a fixed-size dispatch: the send layout in blocks of
    ``T`` rows per destination (padding: token 0, slots -1, weights 0), the int32 meta that
    travels with each row (slots, then the weights' fp32 bits), each token's row in those
    blocks per rank ([T, world], -1: not sent there) and the bad-input flag ([] int64, device)."""
    world = g.world
    tokens, k = topk_idx.shape
    if x.is_cuda:
        from ..kernels.moe_route import route as route_kernel

        table, order, meta, rank_row = route_kernel(topk_idx, topk_weights, num_experts, world, block=tokens)
        send = SendLayout(order, [tokens] * world, meta[:, :k], meta[:, k:].view(torch.float32))
        return send, meta, rank_row, table[0, -1]
    # Elsewhere (the CPU's reference executor) the normal layout, moved into the blocks; the
    # host reads the sizes, which costs nothing off a GPU.
    rt = route(topk_idx, num_experts, world)
    counts = rt.table[:, 0].tolist()
    packed = send_layout(rt, topk_idx, topk_weights, counts, num_experts)
    dev, rows = topk_idx.device, sum(counts)
    dest = torch.repeat_interleave(torch.arange(world, device=dev), torch.tensor(counts, device=dev), output_size=rows)
    start = torch.tensor([sum(counts[:d]) for d in range(world)], dtype=torch.int64, device=dev)
    at = dest * tokens + torch.arange(rows, device=dev) - start[dest]
    order = torch.zeros(world * tokens, dtype=torch.int64, device=dev)
    order[at] = packed.order
    slots = torch.full((world * tokens, k), -1, dtype=torch.int32, device=dev)
    slots[at] = packed.slots
    weights = torch.zeros((world * tokens, k), dtype=torch.float32, device=dev)
    weights[at] = packed.weights.float()
    rank_index = torch.full((tokens * world,), -1, dtype=torch.int64, device=dev)
    rank_index[packed.order * world + dest] = at
    meta = torch.cat([slots, weights.view(torch.int32)], dim=1)
    send = SendLayout(order, [tokens] * world, slots, weights)
    return send, meta, rank_index.view(tokens, world), rt.bad.clamp(max=1)


def expand_fixed(slots: torch.Tensor, local_experts: int):
    """``(rows [bound], counts int32 [local_experts], position [R, k])`` for received ``slots``
    [R, k] (local expert or -1) with no host sync: ``bound = R * k``, the most pairs there can
    be (a row's slots may repeat an expert); rows past the first ``counts.sum()`` are some
    received row (the GPU kernel's: row 0). The kernel on GPUs (at most its expert count), the
    stable sort of :func:`.layout.expansion_order` else."""
    if slots.is_cuda:
        from ..kernels.moe_route import MAX_EXPAND_EXPERTS, expand

        if local_experts <= MAX_EXPAND_EXPERTS:
            position, rows, counts = expand(slots, local_experts, slots.numel(), counts=True)
            return rows, counts, position
    rows, counts, position = expansion_order(slots, local_experts)  # rows: all R * k pairs
    return rows, counts.to(torch.int32), position


def agree_fixed(g, x, topk_idx, topk_weights, num_experts: int, problem: str | None) -> None:
    """The host rendezvous of a fixed-size call: every rank's shapes, dtype and expert count
    side by side; raises ValueError on every rank where any rank's differ or are wrong."""
    dtype_code = zlib.crc32(str(x.dtype).encode())  # every dtype its own (the rows' bytes follow from it)
    shape = [-1, -1, -1] if problem else [topk_idx.shape[0], topk_idx.shape[1], x.shape[1]]
    every = g.exchange_values([num_experts, int(problem is not None), dtype_code, *shape], "conccl.ep.dispatch fixed")
    bad = [r for r, v in enumerate(every) if v[1]]
    if bad:
        raise ValueError(problem or f"rank(s) {bad} called conccl.ep.dispatch with bad input; every rank stops here")
    names = ("num_experts", None, "dtype", "token count", "k", "hidden size")
    for i, name in enumerate(names):
        if name and len({v[i] for v in every}) > 1:
            said = f"this rank's {x.dtype}" if name == "dtype" else f"{[v[i] for v in every]}, by rank"
            raise ValueError(f"conccl.ep.dispatch(fixed_sizes=True): the ranks passed different {name}s "
                             f"({said}): fixed sizes need the same on every rank")
    experts_per_rank(num_experts, g.world)  # raises where they do not split evenly (alike everywhere)


def graph_workspace_bytes(tokens: int, hidden: int, k: int, dtype: torch.dtype, world: int) -> int:
    """Bytes of graph workspace (:func:`conccl.reserve_graph_workspace`) that one captured
    fixed-size dispatch and combine of ``tokens`` x ``hidden`` rows (top-``k``, ``world`` ranks)
    take: their all-to-alls' inputs (the rows with their meta, then the partial sums), each
    rank's chunk rounded up to 256 bytes."""
    row = hidden * torch.empty((), dtype=dtype).element_size()
    meta = 8 * k

    def sent(nbytes):  # one all-to-all's input: world chunks of tokens rows
        return world * (-(-tokens * nbytes // 256) * 256)

    dispatch = sent(row + meta) if row % 4 == 0 else sent(row) + sent(meta)
    return dispatch + sent(row)
