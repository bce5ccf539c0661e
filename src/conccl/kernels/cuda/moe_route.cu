// A MoE dispatch's layouts, each kernel one CTA (moe_route, moe_expand), and the sender's rows
// packed with their meta in one pass (moe_pack, moe_pack_vec); conccl/kernels/moe_route.py says
// what each computes and launches them.
// Options: THREADS_PER_CTA.
#include "conccl.cuh"
#ifndef THREADS_PER_CTA
#error "conccl's MoE routing kernels are compiled with THREADS_PER_CTA (conccl.kernels.moe_route)"
#endif

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
