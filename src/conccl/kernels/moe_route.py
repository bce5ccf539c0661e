"""A MoE dispatch's layouts made by kernels of one CTA each (``kernels/cuda/moe_route.cu``).

``route``: the sender's, what :func:`conccl.ep.layout.route` and
:func:`~conccl.ep.layout.send_layout` compute with about forty torch operations (sorts,
scatters, gathers, each a launch and ~20 us of host time), made here with no sort and one launch.

From ``topk_idx`` [T, k] int64 (expert numbers, -1 none) and fp32 weights [T, k] (or none: ones)
for ``world`` ranks of ``experts / world`` experts each, it writes

- ``table`` [world, experts/world + 2] int64: per destination rank the rows sent there (a token
  once per rank holding any of its experts), the (token, slot) pairs per its local expert, and
  in the last column 1 if any slot names an expert outside -1..E-1 (those slots are ignored);
- ``order`` [capacity] int64: the token of each sent row, rank-major then token-ascending;
- ``meta`` [capacity, 2k] int32: per sent row its top-k slots there (local expert or -1), then
  the slots' weights there as fp32 bits (0.0 where not held);
- ``rank_row`` [T, world] int64: each token's sent row for each rank, or -1 (where combine
  finds what comes back).

Rows beyond the table's total are left as they were. ``capacity = T * min(k, world)``, the most
rows a rank can send. With fixed sizes (``block`` > 0) destination d's rows start at row
``d * block``, ``capacity = world * block`` and every row not filled is padding (token 0, slots
-1, weights 0). How: one pass counts (shared-memory atomics); a second walks the tokens
in blocks of the CTA, and per destination a block-wide exclusive scan (warp ballots) gives each
sent token its row. One CTA of 1024 threads: ``world`` scans per 1024 tokens. No workspace
beyond the outputs.

``pack``: the sent rows and their meta in one buffer, one pass.

``expand``: the receiver's, what :func:`~conccl.ep.layout.plan_expansion` computes
with a stable sort: each received (row, slot) pair's place in the expert-grouped rows, by a
stable counting sort in one CTA (the kernel's comment says how).
"""
from __future__ import annotations

import ctypes
import functools

from ..device.driver import launch
from . import loader
from .reduce import grid_bound

THREADS = 1024
MAX_WORLD = 64  # a token's ranks as one 64-bit mask
DEFINES = {"THREADS_PER_CTA": THREADS}  # moe_route.cu's option: its kernels' __launch_bounds__

MAX_EXPAND_EXPERTS = 320  # (2 + 32) ints each in shared memory: 43.5 KB, under the default 48 KB


@functools.lru_cache(maxsize=None)
def _functions(device_index: int) -> dict:
    """{kernel name: CUfunction} on ``device_index``'s primary context."""
    return {name: loader.function(device_index, "moe_route", name, DEFINES)
            for name in ("moe_route", "moe_expand", "moe_pack", "moe_pack_vec")}


def packable(x, order, meta) -> bool:
    """Whether :func:`pack` takes these: one device, ``x`` contiguous with rows of whole 4-byte
    words and a 4-byte-aligned start, ``order`` contiguous int64, ``meta`` contiguous int32 of
    ``order``'s rows."""
    import torch

    return (x.is_cuda and x.device == order.device == meta.device and x.dim() == 2 and x.is_contiguous()
            and (x.shape[1] * x.element_size()) % 4 == 0 and x.data_ptr() % 4 == 0 and order.dtype == torch.int64
            and order.is_contiguous() and meta.dtype == torch.int32 and meta.is_contiguous()
            and meta.dim() == 2 and meta.shape[0] == order.shape[0])


def pack(x, order, meta):
    """``packed`` [rows, row bytes + meta bytes] uint8: row i is ``x[order[i]]``'s bytes followed
    by ``meta[i]``'s (see :func:`packable` for what it takes), on torch's current stream, one
    kernel of at most half the SMs (conccl.kernels.reduce.grid_bound), 16-byte units
    where rows, meta and pointers allow, else 4-byte words."""
    import torch

    if not packable(x, order, meta):
        raise ValueError(f"moe pack: x {tuple(x.shape)} {x.dtype}, order {tuple(order.shape)} {order.dtype}, "
                         f"meta {tuple(meta.shape)} {meta.dtype} (see packable)")
    rows = order.shape[0]
    row_bytes, meta_bytes = x.shape[1] * x.element_size(), 4 * meta.shape[1]
    packed = torch.empty((rows, row_bytes + meta_bytes), dtype=torch.uint8, device=x.device)
    unit = 16 if (row_bytes % 16 == 0 and meta_bytes % 16 == 0 and x.data_ptr() % 16 == 0
                  and meta.data_ptr() % 16 == 0 and packed.data_ptr() % 16 == 0) else 4
    total = rows * (row_bytes + meta_bytes) // unit
    if total:
        grid = max(1, min(grid_bound(x.device.index), -(-total // THREADS)))
        fn = _functions(x.device.index)["moe_pack_vec" if unit == 16 else "moe_pack"]
        launch(fn, grid, THREADS, 0, torch.cuda.current_stream(x.device).cuda_stream,
                [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(order.data_ptr()), ctypes.c_void_p(meta.data_ptr()),
                 ctypes.c_longlong(rows), ctypes.c_int(row_bytes // unit), ctypes.c_int(meta_bytes // unit),
                 ctypes.c_void_p(packed.data_ptr())])
    return packed


def expand(slots, local_experts: int, total: int, counts: bool = False):
    """``(position [R, k] int64, rows [total] int64)``: the receiver's expansion (what
    :func:`conccl.ep.layout.plan_expansion` computes) of ``slots`` [R, k] int32
    (a view whose rows may be strided, its last dimension contiguous) for ``local_experts``
    experts (at most :data:`MAX_EXPAND_EXPERTS`), ``total`` valid pairs in all; on torch's
    current stream (where the outputs are made); no host sync.

    ``counts``: ``total`` is only a bound (fixed sizes: the host does not know the pairs), the
    rows past the valid ones are 0, and a third result is the pairs per expert, int32
    [local_experts] on the device."""
    import torch

    rows, k = slots.shape
    if slots.dtype != torch.int32 or (k > 1 and slots.stride(1) != 1) or not 0 < local_experts <= MAX_EXPAND_EXPERTS:
        raise ValueError(f"moe expand: slots {slots.dtype} strides {slots.stride()}, {local_experts} experts "
                         f"(int32 rows, at most {MAX_EXPAND_EXPERTS})")
    dev = slots.device
    position = torch.empty((rows, k), dtype=torch.int64, device=dev)
    expanded = (torch.zeros if counts else torch.empty)(total, dtype=torch.int64, device=dev)
    per = torch.zeros(local_experts, dtype=torch.int32, device=dev) if counts else None
    if rows * k:
        s = torch.cuda.current_stream(dev).cuda_stream
        launch(_functions(dev.index)["moe_expand"], 1, THREADS, 4 * 34 * local_experts, s,
                [ctypes.c_void_p(slots.data_ptr()), ctypes.c_longlong(slots.stride(0)), ctypes.c_longlong(rows),
                 ctypes.c_int(k), ctypes.c_int(local_experts), ctypes.c_void_p(position.data_ptr()),
                 ctypes.c_void_p(expanded.data_ptr()), ctypes.c_void_p(0 if per is None else per.data_ptr())])
    return (position, expanded, per) if counts else (position, expanded)


def route(topk_idx, topk_weights, experts: int, world: int, block: int = 0):
    """``(table, order, meta, rank_row)`` (module doc) for ``topk_idx`` [T, k] on its GPU, queued on
    torch's current stream (where the outputs are made); no host sync. ``topk_weights``: [T, k] (any
    float dtype, converted to fp32) or None.

    ``block`` > 0 (at least T): fixed sizes. Destination ``d``'s rows start at row ``d * block``
    (not after the previous destination's), ``order`` and ``meta`` have ``world * block`` rows,
    and every row a destination does not fill is padding: token 0, slots -1, weights 0.
    ``rank_row`` then indexes that layout."""
    import torch

    if not 1 <= world <= MAX_WORLD or experts % world:
        raise ValueError(f"moe route: {experts} experts over {world} ranks (at most {MAX_WORLD}, evenly)")
    tokens, k = topk_idx.shape
    dev = topk_idx.device
    idx = topk_idx.to(torch.int64).contiguous()
    w = None if topk_weights is None else topk_weights.to(torch.float32).contiguous()
    epr = experts // world
    if block and block < tokens:
        raise ValueError(f"moe route: a block of {block} rows cannot hold {tokens} tokens")
    capacity = world * block if block else tokens * min(k, world)
    table = torch.empty((world, epr + 2), dtype=torch.int64, device=dev)
    order = torch.empty(capacity, dtype=torch.int64, device=dev)
    meta = torch.empty((capacity, 2 * k), dtype=torch.int32, device=dev)
    rank_row = torch.empty((tokens, world), dtype=torch.int64, device=dev)
    shared = 4 * (2 * world + experts + 2 + 32)
    s = torch.cuda.current_stream(dev).cuda_stream
    launch(_functions(dev.index)["moe_route"], 1, THREADS, shared, s,
            [ctypes.c_void_p(idx.data_ptr()), ctypes.c_void_p(0 if w is None else w.data_ptr()),
             ctypes.c_int(tokens), ctypes.c_int(k), ctypes.c_int(experts), ctypes.c_int(world), ctypes.c_int(block),
             ctypes.c_void_p(table.data_ptr()), ctypes.c_void_p(order.data_ptr()), ctypes.c_void_p(meta.data_ptr()),
             ctypes.c_void_p(rank_row.data_ptr())])
    return table, order, meta, rank_row
