// The device helpers conccl's kernels share (every .cu beside this file includes it): the
// integer types, the bf16/fp16 conversions and 16-byte (un)packing every sum uses (one text, so
// the reduction, the one-shot call and MoE combine's gathered sum round alike), and the signal
// words' loads, stores and the bounded wait (the spin wait and the one-shot call).
// Compiled by NVRTC (conccl/kernels/loader.py), which includes no system header.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// Operand k of eight scalar parameters x0 .. x7 (a kernel's fixed parameter list: indexing an
// array of pointers would put it in local memory).
#define PICK(x, k) ((k) == 0 ? x##0 : (k) == 1 ? x##1 : (k) == 2 ? x##2 : (k) == 3 ? x##3 : \
                    (k) == 4 ? x##4 : (k) == 5 ? x##5 : (k) == 6 ? x##6 : x##7)

// --- conversions: bit operations and PTX cvt, no cuda_bf16.h ---
__device__ __forceinline__ float half_to_float(u16 h, int bf16) {
    if (bf16) return __uint_as_float(((u32)h) << 16);
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ u16 to_half(float f, int bf16) {
    if (bf16) {
        u32 u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);  // NaN stays a quiet NaN
        u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
        return (u16)(u >> 16);
    }
    u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
// KIND 0: fp32 (4 per 16-byte vector), 1: bf16, 2: fp16 (8 per vector)
template <int KIND> __device__ __forceinline__ void unpack(uint4 v, float* f) {
    u32 w[4] = {v.x, v.y, v.z, v.w};
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (KIND == 0) { f[j] = __uint_as_float(w[j]); }
        else { f[2 * j] = half_to_float((u16)(w[j] & 0xffffu), KIND == 1);
               f[2 * j + 1] = half_to_float((u16)(w[j] >> 16), KIND == 1); }
    }
}
template <int KIND> __device__ __forceinline__ uint4 pack(const float* f) {
    u32 w[4];
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (KIND == 0) w[j] = __float_as_uint(f[j]);
        else w[j] = (u32)to_half(f[2 * j], KIND == 1) | ((u32)to_half(f[2 * j + 1], KIND == 1) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// --- signal words (sm_70: ld.acquire, __nanosleep; the kernels that wait refuse older GPUs) ---
// A signal word is 32 bits in a rank's pad; a waiter waits until (int)(word - value) >= 0 (GEQ,
// as cuStreamWaitValue32's: sequence numbers may wrap around).
#if __CUDA_ARCH__ >= 700
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

// Waits until (int)(*w - v) >= 0 and returns true; returns false at once when the abort word is
// nonzero, or once more than timeout_ns have passed since `start` (%globaltimer), then setting
// the timed-out word to 1. SLEEP_NS > 0: __nanosleep between polls (the warp leaves its
// scheduler, for a wait that may share an SM with a GEMM).
template <int SLEEP_NS> __device__ __forceinline__ bool wait_geq(const u32* w, u32 v, const u32* abort_word, u64 start,
                                                                 u64 timeout_ns, u32* timed_out_word) {
    for (;;) {
        // The relaxed abort load first: an acquire orders the loads after it, not before,
        // so both are in flight at once and a poll costs one load's latency, not two.
        const u32 aborted = ld_relaxed(abort_word);
        if ((int)(ld_acquire(w) - v) >= 0) return true;
        if (aborted) return false;
        if (globaltimer() - start > timeout_ns) { st_relaxed(timed_out_word, 1u); return false; }
        if constexpr (SLEEP_NS > 0) __nanosleep(SLEEP_NS);
    }
}
#endif
