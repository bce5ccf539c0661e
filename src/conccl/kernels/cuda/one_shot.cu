// A whole small collective call as one kernel of one CTA: stage, signal READY, wait for the
// peers' READY, read their staged pieces over NVLink (a gather) or sum them (a reduction: the
// arithmetic of reduce.cu, bit for bit), signal DONE, and (eager) make the release
// (conccl/kernels/one_shot.py says what it costs and the signal protocol).
// Options: THREADS (the CTA), POLL_SLEEP_NS (ns of __nanosleep between polls; 0: none).
#include "conccl.cuh"
#if __CUDA_ARCH__ < 700
#error "conccl's one-shot kernel needs sm_70 (ld.acquire, __nanosleep, __grid_constant__)"
#endif
#if !defined(THREADS) || !defined(POLL_SLEEP_NS)
#error "conccl's one-shot kernel is compiled with THREADS and POLL_SLEEP_NS (conccl.kernels.one_shot)"
#endif
#define MAXW 8

struct OneShotArgs {
    u64 staged[MAXW];       // every rank's staging buffer for this call, as this rank reaches it
    u64 signal_to[MAXW];    // READY words in the peers' pads
    u64 done_to[MAXW];      // DONE words in the peers' pads (FREE in a graph)
    u64 free_to[MAXW];      // FREE words in the peers' pads (the eager release)
    u64 wait_signal[MAXW];  // the own pad's READY words, one per peer
    u64 wait_done[MAXW];    // the own pad's DONE words
    u64 wait_free[MAXW];    // the own pad's FREE words (a graph waits for them first)
    i64 src_off[MAXW];      // gather: piece p's offset in staged[p]; reduce: [0], the same on every rank
    i64 dst_off[MAXW];      // gather: piece p's offset in the output; reduce: [0]
    i64 nbytes[MAXW];       // gather: piece p's bytes; reduce: [0], bytes per operand
    u64 input, output;
    u64 abort_word, timed_out_word;
    u64 timeout_ns;
    i64 stage_bytes;
    int world, rank;
    int kind, dtype;
    int graph, pad0;
    u32 seq; float scale;
};

// The wait of conccl.cuh on one of the own pad's words. When it ends early (the abort word, the
// time bound) the kernel goes on as if released: the group is broken, the watchdog reports it,
// and every later wait of the kernel ends at its first poll.
__device__ __forceinline__ void wait_peer(const OneShotArgs& a, u64 word, u32 v, u64 start) {
    wait_geq<POLL_SLEEP_NS>((const u32*)word, v, (const u32*)a.abort_word, start, a.timeout_ns, (u32*)a.timed_out_word);
}

// --- data loads ---
// A peer's staged data is read with ld.global.cg (cached in L2, not in this SM's L1), volatile
// and with a memory clobber: it must not be hoisted above the wait and the barrier that follow
// the peer's READY, and no line of the buffer from an earlier call (the caller reuses it every
// second call) can be served from L1. The own input goes through the same loads in the sum.
__device__ __forceinline__ uint4 ld_cg16(const void* p) {
    uint4 v; asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_cg4(const void* p) {
    u32 v; asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ u16 ld_cg2(const void* p) {
    u16 v; asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ u32 ld_cg1(const void* p) {  // a byte, zero-extended
    u32 v; asm volatile("ld.global.cg.u8 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}


// --- copies ---
// n bytes by the threads tid, tid + stride, ...: 16-byte vectors where both addresses allow
// (COPY_UNROLL of them in flight per thread: a round trip over NVLink is microseconds, and one
// CTA has only its own loads to cover it), else 4-byte words, and the last bytes one by one.
#define COPY_UNROLL 8
template <bool PEER> __device__ __forceinline__ uint4 load16(const char* p) {
    if constexpr (PEER) return ld_cg16(p); else return *(const uint4*)p;
}
template <bool PEER> __device__ __forceinline__ u32 load4(const char* p) {
    if constexpr (PEER) return ld_cg4(p); else return *(const u32*)p;
}
template <bool PEER> __device__ __forceinline__ u8 load1(const char* p) {
    if constexpr (PEER) return (u8)ld_cg1(p); else return *(const u8*)p;
}
template <bool PEER> __device__ __forceinline__ void copy_bytes(char* dst, const char* src, i64 n, i64 tid, i64 stride) {
    i64 done = 0;
    if ((((u64)dst | (u64)src) & 15) == 0) {
        const i64 nvec = n >> 4;
        for (i64 base = tid; base < nvec; base += stride * COPY_UNROLL) {
            uint4 v[COPY_UNROLL];
            #pragma unroll
            for (int u = 0; u < COPY_UNROLL; ++u) {
                const i64 i = base + u * stride;
                v[u] = i < nvec ? load16<PEER>(src + 16 * i) : make_uint4(0, 0, 0, 0);
            }
            #pragma unroll
            for (int u = 0; u < COPY_UNROLL; ++u) {
                const i64 i = base + u * stride;
                if (i < nvec) *(uint4*)(dst + 16 * i) = v[u];
            }
        }
        done = nvec << 4;
    } else if ((((u64)dst | (u64)src) & 3) == 0) {
        const i64 nw = n >> 2;
        for (i64 base = tid; base < nw; base += stride * COPY_UNROLL) {
            u32 v[COPY_UNROLL];
            #pragma unroll
            for (int u = 0; u < COPY_UNROLL; ++u) {
                const i64 i = base + u * stride;
                v[u] = i < nw ? load4<PEER>(src + 4 * i) : 0u;
            }
            #pragma unroll
            for (int u = 0; u < COPY_UNROLL; ++u) {
                const i64 i = base + u * stride;
                if (i < nw) *(u32*)(dst + 4 * i) = v[u];
            }
        }
        done = nw << 2;
    }
    for (i64 i = done + tid; i < n; i += stride) ((u8*)dst)[i] = load1<PEER>(src + i);
}

// Gather: every peer's piece, the CTA split into one group of threads per peer with bytes to
// read, so that every peer's loads are in flight at once (one round trip, not one per peer).
__device__ __forceinline__ void gather_peers(const OneShotArgs& a) {
    int m = 0;
    for (int p = 0; p < a.world; ++p) m += p != a.rank && a.nbytes[p] > 0;
    if (m == 0) return;
    const int group = (int)blockDim.x / m, g = (int)threadIdx.x / group;
    if (g >= m) return;  // the few threads past m whole groups
    int p = 0;  // the g-th peer with bytes to read
    for (int k = 0;; ++p) {
        if (p == a.rank || a.nbytes[p] <= 0) continue;
        if (k++ == g) break;
    }
    copy_bytes<true>((char*)a.output + a.dst_off[p], (const char*)a.staged[p] + a.src_off[p], a.nbytes[p],
                     (int)threadIdx.x - g * group, group);
}

// --- the sum ---
// Operand q: element i of (q == rank ? input : staged[q]) + src_off[0]; the own operand is the
// input itself (the staged copy is for the peers).
__device__ __forceinline__ const char* operand(const OneShotArgs& a, int q) {
    return (const char*)(q == a.rank ? a.input : a.staged[q]) + a.src_off[0];
}
template <int KIND> __device__ __forceinline__ float load_elem(const char* p, i64 i) {
    if constexpr (KIND == 0) return __uint_as_float(ld_cg4(p + 4 * i));
    else return half_to_float(ld_cg2(p + 2 * i), KIND == 1);
}
// 16-byte vectors, every operand's U vectors loaded before any is used (all W * U loads in
// flight: 8 vectors, 32 registers, whatever the world), then summed in rank order exactly as
// reduce.cu does: acc = x_0 * scale, acc = acc + x_q * scale, each op rounded (__fmul_rn,
// __fadd_rn: never fused), the sum rounded to the dtype once. Not inlined: the 9 variants
// inlined in one kernel made ptxas spill (24-32 bytes a thread at the 64 registers 1024
// threads leave); each as its own function, none spills, for one call per kernel.
template <int KIND, int W, int U> __device__ __noinline__ void reduce_vectors(const OneShotArgs& a, i64 nvec) {
    const int EPV = KIND == 0 ? 4 : 8;
    const float scale = a.scale;
    const i64 stride = blockDim.x;
    char* out = (char*)a.output + a.dst_off[0];
    for (i64 base = threadIdx.x; base < nvec; base += stride * U) {
        uint4 x[W][U];
        #pragma unroll
        for (int q = 0; q < W; ++q) {
            if (q < a.world) {
                const char* s = operand(a, q);
                #pragma unroll
                for (int u = 0; u < U; ++u) {
                    const i64 i = base + u * stride;
                    x[q][u] = i < nvec ? ld_cg16(s + 16 * i) : make_uint4(0, 0, 0, 0);
                }
            }
        }
        #pragma unroll
        for (int u = 0; u < U; ++u) {
            const i64 i = base + u * stride;
            if (i >= nvec) break;
            float acc[EPV], f[EPV];
            unpack<KIND>(x[0][u], f);
            #pragma unroll
            for (int e = 0; e < EPV; ++e) acc[e] = __fmul_rn(f[e], scale);
            #pragma unroll
            for (int q = 1; q < W; ++q) {
                if (q < a.world) {
                    unpack<KIND>(x[q][u], f);
                    #pragma unroll
                    for (int e = 0; e < EPV; ++e) acc[e] = __fadd_rn(acc[e], __fmul_rn(f[e], scale));
                }
            }
            *(uint4*)(out + 16 * i) = pack<KIND>(acc);
        }
    }
}
// Elements [from, n) one by one (any alignment, or the vectors' tail): the same arithmetic.
template <int KIND> __device__ __forceinline__ void reduce_scalar(const OneShotArgs& a, i64 from, i64 n) {
    const float scale = a.scale;
    char* out = (char*)a.output + a.dst_off[0];
    for (i64 i = from + threadIdx.x; i < n; i += blockDim.x) {
        float acc = __fmul_rn(load_elem<KIND>(operand(a, 0), i), scale);
        for (int q = 1; q < a.world; ++q) acc = __fadd_rn(acc, __fmul_rn(load_elem<KIND>(operand(a, q), i), scale));
        if constexpr (KIND == 0) ((float*)out)[i] = acc;
        else ((u16*)out)[i] = to_half(acc, KIND == 1);
    }
}
template <int KIND> __device__ __forceinline__ void reduce(const OneShotArgs& a) {
    const int EPV = KIND == 0 ? 4 : 8, ESIZE = KIND == 0 ? 4 : 2;
    const i64 n = a.nbytes[0] / ESIZE;
    bool vec = ((a.output + a.dst_off[0]) & 15) == 0;  // vectors where every pointer allows them
    for (int q = 0; q < a.world; ++q) vec = vec && (((u64)operand(a, q)) & 15) == 0;
    const i64 nvec = vec ? n / EPV : 0;
    if (nvec > 0) {
        if (a.world <= 2) reduce_vectors<KIND, 2, 4>(a, nvec);
        else if (a.world <= 4) reduce_vectors<KIND, 4, 2>(a, nvec);
        else reduce_vectors<KIND, 8, 1>(a, nvec);
    }
    reduce_scalar<KIND>(a, nvec * EPV, n);
}

// Memory order. The staged bytes (every thread's stores) before READY, and the reads of the
// peers' buffers (every thread's loads) before DONE: __syncthreads, then thread 0 runs one
// fence.acq_rel.sys and writes the words to every peer with relaxed stores. The fence and the
// stores in one thread are PTX's release pattern: one fence for all the words, where
// st.release from each waiting thread would pay a fence each (st.release after the fence
// paid for both: a one-thread writing kernel took 4.9 us back to back, 3.5 this way), and
// the barrier before it makes the other threads' accesses part of what it releases. The waits:
// thread t's acquire load of peer t's READY, then __syncthreads, then everyone's loads. A
// reset (graph) is a relaxed store by the waiting thread, released by the next fenced signal
// of thread 0, which the peer must see before it writes the word again. The release (eager):
// thread t waits for peer t's DONE(seq - 1) and writes FREE with st.release (one thread per
// word; the warp's threads issue it together), the chain the peer's writes into this rank's
// buffers must follow.
// __grid_constant__: the struct stays in the parameter space even where indexed by a thread's
// rank (else it is copied to every thread's local memory).
extern "C" __global__ void __launch_bounds__(THREADS) conccl_one_shot(const __grid_constant__ OneShotArgs a) {
    const u64 start = globaltimer();
    const int t = threadIdx.x, w = a.world, r = a.rank;
    const bool waiter = t < w && t != r;  // thread t waits for peer t
    const u32 v = a.graph ? 1u : a.seq;
    // 1. a captured call: the peers are done reading this rank's staging buffer (previous replay)
    if (a.graph) {
        if (waiter) { wait_peer(a, a.wait_free[t], 1u, start); st_relaxed((u32*)a.wait_free[t], 0u); }
        __syncthreads();
    }
    // 2. stage
    copy_bytes<false>((char*)a.staged[r], (const char*)a.input, a.stage_bytes, t, blockDim.x);
    __syncthreads();
    // 3. READY to every peer
    if (t == 0 && w > 1) {
        fence_sys();
        for (int p = 0; p < w; ++p) if (p != r) st_relaxed((u32*)a.signal_to[p], v);
    }
    // 4. the peers' READY; meanwhile the other threads copy the own piece (gather: after READY,
    // not before as the schedule lists it, so the peers start reading sooner; it touches only
    // this rank's input and output, which no peer reads)
    if (waiter) {
        wait_peer(a, a.wait_signal[t], v, start);
        if (a.graph) st_relaxed((u32*)a.wait_signal[t], 0u);
    }
    if (a.kind == 0 && a.nbytes[r] > 0)
        copy_bytes<false>((char*)a.output + a.dst_off[r], (const char*)a.input + a.src_off[r], a.nbytes[r], t, blockDim.x);
    __syncthreads();
    // 5. the peers' pieces, or the sum
    if (a.kind == 0) gather_peers(a);
    else if (a.dtype == 0) reduce<0>(a);
    else if (a.dtype == 1) reduce<1>(a);
    else reduce<2>(a);
    __syncthreads();
    // 6. DONE (a graph: FREE) to every peer
    if (t == 0 && w > 1) {
        fence_sys();
        for (int p = 0; p < w; ++p) if (p != r) st_relaxed((u32*)a.done_to[p], v);
    }
    // 7. the eager release: DONE(seq - 1) of peer t, then FREE = seq to it (conccl.schedule.base)
    if (!a.graph && waiter) {
        wait_peer(a, a.wait_done[t], a.seq - 1u, start);
        st_release((u32*)a.free_to[t], a.seq);
    }
}
