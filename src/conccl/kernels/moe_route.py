"""A MoE dispatch's layouts made by kernels of one CTA each. ``route``: the sender's, what
:func:`conccl.ep.layout.route` and :func:`~conccl.ep.layout.send_layout`
compute with about forty torch operations (sorts, scatters, gathers, each a launch and ~20 us of
host time), made here with no sort and one launch.

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

from ..device.driver import check, driver, launch, load_module

THREADS = 1024
MAX_WORLD = 64  # a token's ranks as one 64-bit mask

_SOURCE = r"""
typedef long long i64;
typedef unsigned long long u64;

__device__ __forceinline__ u64 ranks_of(const i64* idx, int t, int k, int experts, int epr) {
    u64 mask = 0;
    for (int j = 0; j < k; ++j) {
        const i64 e = idx[(i64)t * k + j];
        if (e >= 0 && e < experts) mask |= 1ull << (int)(e / epr);
    }
    return mask;
}

extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) moe_route(
        const i64* idx, const float* weights, int tokens, int k, int experts, int world, int block,
        i64* table, i64* order, int* meta, i64* rank_row) {
    extern __shared__ int sh[];
    const int epr = experts / world;
    int* count = sh;                 // [world] rows per destination
    int* pairs = count + world;      // [experts] pairs per expert
    int* bad = pairs + experts;      // [1]
    int* total = bad + 1;            // [1] the block's sent tokens to the current destination
    int* warp_sum = total + 1;       // [32] then each warp's exclusive prefix
    int* base = warp_sum + 32;       // [world] next row of each destination
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    for (int i = tid; i < world + experts + 1; i += blockDim.x) sh[i] = 0;
    for (i64 i = tid; i < (i64)tokens * world; i += blockDim.x) rank_row[i] = -1;
    // Fixed blocks: every row of every destination's block starts as padding (token 0, no slot),
    // so the block's unused tail travels as rows the receiver ignores.
    for (i64 i = tid; i < (i64)block * world; i += blockDim.x) {
        order[i] = 0;
        for (int j = 0; j < k; ++j) { meta[i * 2 * k + j] = -1; meta[i * 2 * k + k + j] = 0; }
    }
    __syncthreads();
    for (int t = tid; t < tokens; t += blockDim.x) {
        u64 mask = 0;
        for (int j = 0; j < k; ++j) {
            const i64 e = idx[(i64)t * k + j];
            if (e < -1 || e >= experts) atomicAdd(bad, 1);
            else if (e >= 0) { mask |= 1ull << (int)(e / epr); atomicAdd(&pairs[e], 1); }
        }
        for (int d = 0; d < world; ++d) if ((mask >> d) & 1ull) atomicAdd(&count[d], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int running = 0;
        for (int d = 0; d < world; ++d) { base[d] = block ? d * block : running; running += count[d]; }
    }
    const int cols = epr + 2;
    for (int i = tid; i < world * cols; i += blockDim.x) {
        const int d = i / cols, c = i - d * cols;
        table[i] = c == 0 ? count[d] : c <= epr ? pairs[d * epr + c - 1] : (*bad > 0);
    }
    __syncthreads();
    for (int chunk = 0; chunk < tokens; chunk += blockDim.x) {
        const int t = chunk + tid;
        const u64 mask = t < tokens ? ranks_of(idx, t, k, experts, epr) : 0ull;
        for (int d = 0; d < world; ++d) {
            const int flag = (int)((mask >> d) & 1ull);
            const unsigned ballot = __ballot_sync(0xffffffffu, flag);
            const int before = __popc(ballot & ((1u << lane) - 1u));
            if (lane == 0) warp_sum[warp] = __popc(ballot);
            __syncthreads();
            if (warp == 0) {  // exclusive scan of the warps' counts
                const int v = lane < warps ? warp_sum[lane] : 0;
                int incl = v;
                for (int o = 1; o < 32; o <<= 1) {
                    const int u = __shfl_up_sync(0xffffffffu, incl, o);
                    if (lane >= o) incl += u;
                }
                warp_sum[lane] = incl - v;
                if (lane == 31) *total = incl;
            }
            __syncthreads();
            if (flag) {
                const i64 row = (i64)base[d] + warp_sum[warp] + before;
                order[row] = t;
                rank_row[(i64)t * world + d] = row;
                int* m = meta + row * 2 * k;
                for (int j = 0; j < k; ++j) {
                    const i64 e = idx[(i64)t * k + j];
                    const bool held = e >= 0 && e < experts && (int)(e / epr) == d;
                    m[j] = held ? (int)(e % epr) : -1;
                    m[k + j] = held ? __float_as_int(weights ? weights[(i64)t * k + j] : 1.0f) : 0;
                }
            }
            __syncthreads();
            if (tid == 0) base[d] += *total;
            __syncthreads();
        }
    }
}

// The receiver's expansion: received rows' slots (int32, row stride `stride`, local expert or -1)
// into one row per (row, slot) pair grouped by expert, then by (row, slot) order: a stable
// counting sort. Pass 1 counts per expert; pass 2 walks the pairs in blocks of the CTA, each
// pair's place = its expert's start + the pairs of that expert in earlier blocks + in earlier
// warps of this block (a per-warp, per-expert count table, scanned over warps) + in earlier lanes
// of its warp (__match_any_sync). Shared memory: (2 + 32) ints per expert.
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) moe_expand(
        const int* slots, long long stride, long long rows, int k, int experts, i64* position, i64* expanded,
        int* counts) {
    extern __shared__ int sh[];
    int* base = sh;                  // [experts] next place of each expert
    int* chunk_total = base + experts;  // [experts]
    int* wc = chunk_total + experts;  // [32][experts]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    const i64 pairs = rows * k;
    for (int i = tid; i < experts; i += blockDim.x) base[i] = 0;
    __syncthreads();
    for (i64 p = tid; p < pairs; p += blockDim.x) {
        const i64 r = p / k; const int j = (int)(p - r * k);
        const int e = slots[r * stride + j];
        if (e >= 0 && e < experts) atomicAdd(&base[e], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int running = 0;
        for (int e = 0; e < experts; ++e) {
            const int c = base[e];
            if (counts) counts[e] = c;
            base[e] = running;
            running += c;
        }
    }
    __syncthreads();
    for (i64 chunk = 0; chunk < pairs; chunk += blockDim.x) {
        const i64 p = chunk + tid;
        int e = -1;
        i64 r = 0;
        if (p < pairs) {
            r = p / k;
            const int j = (int)(p - r * k);
            e = slots[r * stride + j];
            if (e < 0 || e >= experts) e = -1;
        }
        const unsigned same = __match_any_sync(0xffffffffu, e);
        const int before = __popc(same & ((1u << lane) - 1u));
        for (int i = lane; i < experts; i += 32) wc[warp * experts + i] = 0;
        __syncwarp();
        if (e >= 0 && before == 0) wc[warp * experts + e] = __popc(same);
        __syncthreads();
        for (int i = tid; i < experts; i += blockDim.x) {  // exclusive scan over the warps, per expert
            int run = 0;
            for (int w = 0; w < warps; ++w) { const int c = wc[w * experts + i]; wc[w * experts + i] = run; run += c; }
            chunk_total[i] = run;
        }
        __syncthreads();
        if (p < pairs) {
            if (e >= 0) {
                const i64 at = (i64)base[e] + wc[warp * experts + e] + before;
                position[p] = at;
                expanded[at] = r;
            } else {
                position[p] = -1;
            }
        }
        __syncthreads();
        for (int i = tid; i < experts; i += blockDim.x) base[i] += chunk_total[i];
        __syncthreads();
    }
}

// The sender's rows, packed: row i of `packed` (`row_units + meta_units` units of U: 4 or 16
// bytes) is token order[i]'s row of x (`row_units`) followed by meta[i] (`meta_units`): what
// the all-to-all sends, in one pass instead of a gather and a concatenation. Grid-stride over units.
template <typename U> __device__ __forceinline__ void pack_rows(
        const U* x, const i64* order, const U* meta, long long rows, int row_units, int meta_units, U* packed) {
    const long long width = row_units + meta_units, total = rows * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += stride) {
        const long long r = i / width;
        const int c = (int)(i - r * width);
        packed[i] = c < row_units ? x[order[r] * row_units + c] : meta[r * meta_units + (c - row_units)];
    }
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) moe_pack(
        const unsigned* x, const i64* order, const unsigned* meta, long long rows, int row_units, int meta_units,
        unsigned* packed) {
    pack_rows<unsigned>(x, order, meta, rows, row_units, meta_units, packed);
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) moe_pack_vec(
        const uint4* x, const i64* order, const uint4* meta, long long rows, int row_units, int meta_units,
        uint4* packed) {
    pack_rows<uint4>(x, order, meta, rows, row_units, meta_units, packed);
}
"""

MAX_EXPAND_EXPERTS = 320  # (2 + 32) ints each in shared memory: 43.5 KB, under the default 48 KB


def source() -> str:
    """The kernel's CUDA C, as compiled (for compile checks without a GPU)."""
    return f"#define THREADS_PER_CTA {THREADS}\n{_SOURCE}"


@functools.lru_cache(maxsize=None)
def _functions(device_index: int) -> dict:
    module = load_module(device_index, source(), "conccl_moe_route.cu", "the MoE routing kernels")
    return {name: check(driver().cuModuleGetFunction(module, name.encode()))
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

    from .reduce import grid_bound

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
