"""A whole small collective call as one kernel of one CTA: stage, signal, wait, read over NVLink.

A copy-engine call pays for its signals (stream memory operations: 6.5 us one way on 2 x H100
eager, benchmarks/2026-11-26-h100x2-latency) and for a driver call per step. For a small call
this kernel does the whole call in one launch, its signals by loads and stores from the SM (a
kernel polling a word woke in 2.85 us one way in that benchmark, :mod:`conccl.kernels.spin`;
this kernel's own round trip is not measured yet): it copies the rank's input into its staging
buffer, signals READY to every peer, waits for every peer's READY, reads what it needs from the
peers' staging buffers with loads through peer pointers (NVLink), writes the output, signals
DONE and (eager) makes the release.

Two kinds: 0 gather (all-gather, all-to-all: pieces copied) and 1 reduce (all-reduce,
reduce-scatter: ``sum(scale * x_q)`` over every rank's piece in rank order, fp32, rounded once:
exactly :mod:`conccl.kernels.reduce`'s arithmetic, so the copy-engine path's bits).

What it costs and needs:

* SMs: one CTA of :data:`THREADS` threads on one SM, for the whole call, waits included: it
  spins on its peers' signals and then reads every peer's piece itself (loads over NVLink,
  about 128 KiB in flight for the CTA), so it is for small calls only.
* Launch it on a high-priority stream: beside a GEMM that fills every SM, the CTA scheduler
  gives it the first free slot instead of queueing it behind the GEMM's remaining CTAs.
* Workspace: ``stage_bytes`` of the caller's staging buffer, which must be peer-mapped; the
  caller double-buffers it (call ``seq`` uses half ``seq % 2``: :mod:`conccl.schedule.base`), so the
  staging of call ``seq`` only has to wait for the peers' reads of call ``seq - 2``.
* Bounded like :mod:`conccl.kernels.spin`'s wait: every spin ends after ``timeout_ns``
  from the kernel's start (``%globaltimer``), setting the ``timed_out`` word to 1, or at once on
  a nonzero abort word; the kernel then goes on **as if released** (the group is broken anyway,
  the watchdog reports it), so the output of a call that timed out is garbage.

Signals (words ``kind * world + src`` in the owner's pad, waits GEQ with wrap-around:
``(int)(word - value) >= 0``). Eager (``graph == 0``): READY and DONE carry ``seq``; at its end
the call waits for every peer's DONE(seq - 1) and writes FREE = ``seq`` to every peer (the
release of :func:`conccl.schedule.base.release_ops`). Captured (``graph == 1``: one graph replayed,
the sequence number frozen): every signal writes 1 and every waiter resets the word to 0 once
it has seen it; the call starts by waiting for each peer's FREE (>= 1, then reset: the peer
finished reading this rank's staging buffer in the previous replay; the caller primes the words
with 1 for the first one), and ``done_to`` points at the peers' FREE words, so the DONE it
writes is that FREE. The memory ordering (why a fence and relaxed stores, why ``ld.global.cg``
for peer data) is said in the kernel source.

Compiled once per process and device with NVRTC, without headers; the module imports without
CUDA or cuda-python: both are loaded where a launch is first built, after its arguments are
checked.
"""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

from ..device.driver import check, driver, load_module
from .reduce import CONVERSIONS
from .spin import POLL_SLEEP_NS

MAX_WORLD = 8  # the kernel's arrays: an NVLink node's GPUs
THREADS = 1024  # the CTA: its threads share the copies and the sum; thread t < world waits for peer t
KIND_GATHER, KIND_REDUCE = 0, 1
KINDS = {"gather": KIND_GATHER, "reduce": KIND_REDUCE}
DTYPES = {"float32": 0, "bfloat16": 1, "float16": 2}  # the reduction's; a gather ignores it
ESIZE = {0: 4, 1: 2, 2: 2}

_u64, _i64 = ctypes.c_uint64, ctypes.c_int64
_ARRAYS = ("staged", "signal_to", "done_to", "free_to", "wait_signal", "wait_done", "wait_free",
           "src_off", "dst_off", "nbytes")
_OFFSETS = ("src_off", "dst_off", "nbytes")  # signed, the rest addresses


class OneShotArgs(ctypes.Structure):
    """The kernel's one parameter, passed by value: the same layout as ``struct OneShotArgs``
    in :data:`_SOURCE` (8-byte fields first, the 4-byte ones last and in pairs, so no padding:
    720 bytes, 8-aligned; tests/unit/test_oneshot_args.py checks every offset)."""

    _fields_ = ([(name, (_i64 if name in _OFFSETS else _u64) * MAX_WORLD) for name in _ARRAYS]
                + [("input", _u64), ("output", _u64), ("abort_word", _u64), ("timed_out_word", _u64),
                   ("timeout_ns", _u64), ("stage_bytes", _i64),
                   ("world", ctypes.c_int), ("rank", ctypes.c_int), ("kind", ctypes.c_int), ("dtype", ctypes.c_int),
                   ("graph", ctypes.c_int), ("pad0", ctypes.c_int), ("seq", ctypes.c_uint), ("scale", ctypes.c_float)])


_SOURCE = r"""
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "conccl's one-shot kernel needs sm_70 (ld.acquire, __nanosleep, __grid_constant__)"
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

// --- signal words (cuda_spin's) ---
__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ u32 ld_relaxed(const u32* p) {
    u32 v; asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void st_relaxed(u32* p, u32 v) {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ u64 globaltimer() {  // ns, the same clock on every SM
    u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}

// Waits until (int)(*w - v) >= 0 (GEQ, wraps around), at most until timeout_ns after the
// kernel's start (then the timed-out word is set) or until the abort word is nonzero; either
// way it returns and the kernel goes on as if released: the group is broken, the watchdog
// reports it, and every later wait of the kernel ends at its first poll.
__device__ __forceinline__ void wait_geq(const OneShotArgs& a, u64 word, u32 v, u64 start) {
    const u32* w = (const u32*)word;
    for (;;) {
        // The relaxed abort load first: an acquire orders the loads after it, not before,
        // so both are in flight at once and a poll costs one load's latency, not two.
        const u32 aborted = ld_relaxed((const u32*)a.abort_word);
        if ((int)(ld_acquire(w) - v) >= 0) return;
        if (aborted) return;
        if (globaltimer() - start > a.timeout_ns) { st_relaxed((u32*)a.timed_out_word, 1u); return; }
#if POLL_SLEEP_NS > 0
        __nanosleep(POLL_SLEEP_NS);
#endif
    }
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

// --- conversions: cuda_reduce's own text (the sum must be its bits) ---
""" + CONVERSIONS + r"""

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
// cuda_reduce does: acc = x_0 * scale, acc = acc + x_q * scale, each op rounded (__fmul_rn,
// __fadd_rn: never fused), the sum rounded to the dtype once. Not inlined: the 9 variants
// inlined in one kernel made ptxas spill (24-32 bytes a thread at the 64 registers 1024
// threads leave); each as its own function, none spills, for one call per kernel.
template <int KIND, int W, int U> __device__ __noinline__ void reduce_vec(const OneShotArgs& a, i64 nvec) {
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
        if (a.world <= 2) reduce_vec<KIND, 2, 4>(a, nvec);
        else if (a.world <= 4) reduce_vec<KIND, 4, 2>(a, nvec);
        else reduce_vec<KIND, 8, 1>(a, nvec);
    }
    reduce_scalar<KIND>(a, nvec * EPV, n);
}

// Memory order. The staged bytes (every thread's stores) before READY, and the reads of the
// peers' buffers (every thread's loads) before DONE: __syncthreads, then thread 0 runs one
// fence.acq_rel.sys and writes the words to every peer with relaxed stores. The fence and the
// stores in one thread are PTX's release pattern (cuda_spin's conccl_signal_write: one fence
// for all the words, where st.release from each waiting thread would pay a fence each), and
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
        if (waiter) { wait_geq(a, a.wait_free[t], 1u, start); st_relaxed((u32*)a.wait_free[t], 0u); }
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
        wait_geq(a, a.wait_signal[t], v, start);
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
        wait_geq(a, a.wait_done[t], a.seq - 1u, start);
        st_release((u32*)a.free_to[t], a.seq);
    }
}
"""


@functools.lru_cache(maxsize=None)
def _module(device_index: int):
    """(module, kernel) on ``device_index``'s primary context (current when torch runs there)."""
    cu = driver()
    module = load_module(device_index, _defines() + _SOURCE, "conccl_oneshot.cu", "the one-shot kernel")
    return module, check(cu.cuModuleGetFunction(module, b"conccl_one_shot"))


def _defines() -> str:
    return f"#define THREADS {THREADS}\n#define POLL_SLEEP_NS {int(POLL_SLEEP_NS)}\n"


def _code(value, names: dict, what: str) -> int:
    code = names.get(value, value) if isinstance(value, str) else value
    if isinstance(code, bool) or not isinstance(code, int) or code not in names.values():
        raise ValueError(f"the one-shot kernel's {what} must be one of {sorted(names)} or {sorted(names.values())}, "
                         f"got {value!r}")
    return code


def make_args(*, world: int, rank: int, kind, dtype, graph: bool, staged: Sequence[int], signal_to: Sequence[int],
              done_to: Sequence[int], free_to: Sequence[int], wait_signal: Sequence[int], wait_done: Sequence[int],
              wait_free: Sequence[int], src_off: Sequence[int], dst_off: Sequence[int], nbytes: Sequence[int],
              input: int, output: int, stage_bytes: int, scale: float, abort_word: int, timed_out_word: int,
              timeout_ns: int) -> OneShotArgs:
    """The kernel's argument struct (pure: no CUDA). Every per-rank sequence has ``world``
    entries, indexed by rank (the own rank's signal words are never touched: 0 will do); the
    rest of the kernel's arrays are filled with 0. ``kind``: 0 / "gather" or 1 / "reduce";
    ``dtype``: 0 / "float32", 1 / "bfloat16", 2 / "float16" (a gather's is ignored: pass 0).
    ``seq`` is written at each launch (:meth:`OneShotLaunch.launch`). Raises ValueError for
    anything the kernel cannot run (checked again by :class:`OneShotLaunch`)."""
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
        raise ValueError(f"the one-shot kernel takes a world of 1 to {MAX_WORLD} ranks, got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(f"the one-shot kernel's rank must be in 0..{world - 1}, got {rank!r}")
    per_rank = {"staged": staged, "signal_to": signal_to, "done_to": done_to, "free_to": free_to,
                "wait_signal": wait_signal, "wait_done": wait_done, "wait_free": wait_free, "src_off": src_off,
                "dst_off": dst_off, "nbytes": nbytes}
    args = OneShotArgs()
    for name, values in per_rank.items():
        values = list(values)
        if len(values) != world:
            raise ValueError(f"the one-shot kernel's {name} needs one entry per rank ({world}), got {len(values)}")
        low, high, what = (-(1 << 63), 1 << 63, "a 64-bit byte count") if name in _OFFSETS else \
            (0, 1 << 64, "a device address")
        for x in values:
            if isinstance(x, bool) or not isinstance(x, int) or not low <= x < high:
                raise ValueError(f"the one-shot kernel's {name} holds {x!r}: not {what}")
        getattr(args, name)[:] = values + [0] * (MAX_WORLD - world)
    for name, x in (("input", input), ("output", output), ("abort_word", abort_word),
                    ("timed_out_word", timed_out_word), ("timeout_ns", timeout_ns)):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 1 << 64:
            raise ValueError(f"the one-shot kernel's {name} must be a 64-bit unsigned integer, got {x!r}")
        setattr(args, name, x)
    if not isinstance(stage_bytes, int) or not 0 <= stage_bytes < 1 << 63:
        raise ValueError(f"the one-shot kernel's stage_bytes must be a byte count, got {stage_bytes!r}")
    args.stage_bytes, args.world, args.rank = stage_bytes, world, rank
    args.kind, args.dtype = _code(kind, KINDS, "kind"), _code(dtype, DTYPES, "dtype")
    args.graph, args.scale, args.seq = int(bool(graph)), float(scale), 0
    _validate(args)
    return args


def _validate(a: OneShotArgs) -> None:
    """Everything the kernel relies on, checked before anything touches CUDA: a bad address
    would fault the GPU and kill the context, a bad count or code would read past the arrays."""
    if not 1 <= a.world <= MAX_WORLD:
        raise ValueError(f"the one-shot kernel takes a world of 1 to {MAX_WORLD} ranks, got {a.world}")
    if not 0 <= a.rank < a.world:
        raise ValueError(f"the one-shot kernel's rank must be in 0..{a.world - 1}, got {a.rank}")
    if a.kind not in KINDS.values():
        raise ValueError(f"the one-shot kernel's kind must be 0 (gather) or 1 (reduce), got {a.kind}")
    if a.dtype not in DTYPES.values():
        raise ValueError(f"the one-shot kernel's dtype must be 0 (float32), 1 (bfloat16) or 2 (float16), got {a.dtype}")
    if a.graph not in (0, 1):
        raise ValueError(f"the one-shot kernel's graph flag must be 0 or 1, got {a.graph}")
    if a.stage_bytes < 0 or any(a.nbytes[p] < 0 for p in range(a.world)):
        raise ValueError(f"the one-shot kernel's byte counts must be >= 0: stage_bytes {a.stage_bytes}, "
                         f"nbytes {list(a.nbytes[:a.world])}")
    if a.timeout_ns <= 0:
        raise ValueError("the one-shot kernel's timeout must be positive")
    r, peers = a.rank, [p for p in range(a.world) if p != a.rank]
    needed = [("abort_word", a.abort_word), ("timed_out_word", a.timed_out_word)]
    needed += [(f"{name}[{p}]", getattr(a, name)[p]) for name in ("signal_to", "done_to", "wait_signal")
               for p in peers]
    needed += [(f"wait_free[{p}]", a.wait_free[p]) for p in peers if a.graph]
    needed += [(f"{name}[{p}]", getattr(a, name)[p]) for name in ("free_to", "wait_done") for p in peers
               if not a.graph]
    if a.stage_bytes:
        needed += [("input", a.input), (f"staged[{r}]", a.staged[r])]
    if a.kind == KIND_GATHER:
        if a.nbytes[r]:
            needed += [("input", a.input), ("output", a.output)]
        needed += [x for p in peers if a.nbytes[p] for x in ((f"staged[{p}]", a.staged[p]), ("output", a.output))]
    elif a.nbytes[0]:
        esize = ESIZE[a.dtype]
        if a.nbytes[0] % esize or a.src_off[0] % esize or a.dst_off[0] % esize:
            raise ValueError(f"the one-shot reduction's bytes and offsets must be whole elements of {esize} bytes: "
                             f"nbytes {a.nbytes[0]}, src_off {a.src_off[0]}, dst_off {a.dst_off[0]}")
        needed += [("input", a.input), ("output", a.output)] + [(f"staged[{p}]", a.staged[p]) for p in peers]
    missing = sorted({name for name, address in needed if not address})
    if missing:
        raise ValueError(f"the one-shot kernel would touch address 0 through {', '.join(missing)}")


class OneShotLaunch:
    """One prebuilt launch of ``conccl_one_shot``: grid 1, :data:`THREADS` threads, the struct
    as its one parameter (a copy of ``args``, validated first; the driver copies it at each
    launch, into a graph being captured too). :meth:`launch` writes the call's sequence number
    into it (a captured call: any; the kernel writes and waits for 1)."""

    def __init__(self, device_index: int, args: OneShotArgs):
        _validate(args)  # before anything touches CUDA: a bad call fails where it is built, on any machine
        self.args = OneShotArgs.from_buffer_copy(args)
        _, self.function = _module(device_index)
        self._params = (ctypes.c_void_p * 1)(ctypes.addressof(self.args))
        self.params = ctypes.addressof(self._params)

    def launch(self, cu, stream, seq: int):
        """Queue the kernel on ``stream`` (a ``CUstream``; a high-priority one: module doc) for
        call ``seq``; returns cuLaunchKernel's result tuple, unchecked (the caller names the
        failing step)."""
        self.args.seq = seq & 0xFFFFFFFF
        return cu.cuLaunchKernel(self.function, 1, 1, 1, THREADS, 1, 1, 0, stream, self.params, 0)
