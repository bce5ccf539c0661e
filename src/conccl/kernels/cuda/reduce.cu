// The reduction: dst = sum(scale * src_k) over up to 8 operands, elementwise, with a
// grid-stride loop over a bounded grid (conccl/kernels/reduce.py chooses the kernel and the
// grid). Arithmetic, the CPU reference executor's bit for bit: every operand converted to fp32
// and multiplied by scale (__fmul_rn), the products added in operand order (__fadd_rn: never
// fused into an FMA), the sum rounded to the dtype once (round to nearest even).
// Options: THREADS_PER_CTA (the pair, wide and scalar kernels' CTA), THREADS_MANY_PER_CTA (the
// general vector kernels').
#include "conccl.cuh"
#if !defined(THREADS_PER_CTA) || !defined(THREADS_MANY_PER_CTA)
#error "conccl's reduction is compiled with THREADS_PER_CTA and THREADS_MANY_PER_CTA (conccl.kernels.reduce)"
#endif

#define UNROLL 2  // 16-byte vectors in flight per thread and operand, two operands (reduce.py: THREADS)
#define UNROLL_MANY 8  // the same for three or more operands, read one after the other
// The vector kernels' loads and stores: every operand is read once and the result written
// once, so they go through L2 marked evict-first and leave what a GEMM beside them keeps there
// (beside a GEMM about as good as plain ones at 1024 x 2, within the noise; under the general
// kernels' 512-thread bound 2.5x faster than plain loads: reduce.py, THREADS). The load's asm is
// not volatile and touches memory the compiler does not see: correct because every element is
// read and written by one thread, each store after the loads it depends on, dst never re-read
// (an in-place sum has dst == s0).
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ unsigned long long evict_first() {
    unsigned long long pol; asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol)); return pol;
}
__device__ __forceinline__ uint4 ld_evict_first(const uint4* p) {
    uint4 v; asm("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(evict_first()));
    return v;
}
__device__ __forceinline__ void st_evict_first(uint4* p, uint4 v) {
    asm volatile("st.global.L1::no_allocate.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(evict_first()) : "memory");
}
#else  // cache policies need sm_80
__device__ __forceinline__ uint4 ld_evict_first(const uint4* p) { return *p; }
__device__ __forceinline__ void st_evict_first(uint4* p, uint4 v) { *p = v; }
#endif
#define LDV(p) ld_evict_first(p)
#define STV(p, v) st_evict_first(p, v)

__device__ __forceinline__ float load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float load(const u16* p, long long i, int bf16) { return half_to_float(p[i], bf16); }

#define OPERANDS const void* s0, const void* s1, const void* s2, const void* s3, \
                 const void* s4, const void* s5, const void* s6, const void* s7


// Every kernel carries __launch_bounds__ of the CTA it is launched with (THREADS_PER_CTA, or
// THREADS_MANY_PER_CTA for the general vector kernels): at 1024 threads a thread has 64 registers.
// Every pointer 16-byte aligned: the n / EPV whole vectors, UNROLL of them per thread at once;
// the remaining (< EPV) elements one by one. The arithmetic is the scalar kernels' exactly.
template <int KIND, int PAIR> __device__ __forceinline__ void reduce_vec(void* dst, OPERANDS, int nsrc, long long n, float scale) {
    const int EPV = KIND == 0 ? 4 : 8;
    const long long nvec = n / EPV, stride = (long long)gridDim.x * blockDim.x;
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (PAIR) {  // two operands (two ranks): both loads in flight at once, no accumulator kept
        for (long long base = tid; base < nvec; base += stride * UNROLL) {
            uint4 a[UNROLL], b[UNROLL];
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                long long i = base + u * stride;
                a[u] = i < nvec ? LDV((const uint4*)s0 + i) : make_uint4(0, 0, 0, 0);
                b[u] = i < nvec ? LDV((const uint4*)s1 + i) : make_uint4(0, 0, 0, 0);
            }
            #pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                float fa[EPV], fb[EPV];
                unpack<KIND>(a[u], fa); unpack<KIND>(b[u], fb);
                #pragma unroll
                for (int e = 0; e < EPV; ++e) fa[e] = __fadd_rn(__fmul_rn(fa[e], scale), __fmul_rn(fb[e], scale));
                long long i = base + u * stride;
                if (i < nvec) STV((uint4*)dst + i, pack<KIND>(fa));
            }
        }
    } else
    for (long long base = tid; base < nvec; base += stride * UNROLL_MANY) {
        float acc[UNROLL_MANY][EPV];
        uint4 v[UNROLL_MANY];
        #pragma unroll
        for (int u = 0; u < UNROLL_MANY; ++u) {
            long long i = base + u * stride;
            v[u] = i < nvec ? LDV((const uint4*)s0 + i) : make_uint4(0, 0, 0, 0);
        }
        #pragma unroll
        for (int u = 0; u < UNROLL_MANY; ++u) {
            float f[EPV]; unpack<KIND>(v[u], f);
            #pragma unroll
            for (int e = 0; e < EPV; ++e) acc[u][e] = __fmul_rn(f[e], scale);
        }
        for (int k = 1; k < nsrc; ++k) {
            const uint4* p = (const uint4*)PICK(s, k);
            #pragma unroll
            for (int u = 0; u < UNROLL_MANY; ++u) {
                long long i = base + u * stride;
                v[u] = i < nvec ? LDV(p + i) : make_uint4(0, 0, 0, 0);
            }
            #pragma unroll
            for (int u = 0; u < UNROLL_MANY; ++u) {
                float f[EPV]; unpack<KIND>(v[u], f);
                #pragma unroll
                for (int e = 0; e < EPV; ++e) acc[u][e] = __fadd_rn(acc[u][e], __fmul_rn(f[e], scale));
            }
        }
        #pragma unroll
        for (int u = 0; u < UNROLL_MANY; ++u) {
            long long i = base + u * stride;
            if (i < nvec) STV((uint4*)dst + i, pack<KIND>(acc[u]));
        }
    }
    for (long long i = nvec * EPV + tid; i < n; i += stride) {  // the tail
        if (KIND == 0) {
            float a = __fmul_rn(load((const float*)s0, i), scale);
            for (int k = 1; k < nsrc; ++k) a = __fadd_rn(a, __fmul_rn(load((const float*)PICK(s, k), i), scale));
            ((float*)dst)[i] = a;
        } else {
            float a = __fmul_rn(load((const u16*)s0, i, KIND == 1), scale);
            for (int k = 1; k < nsrc; ++k) a = __fadd_rn(a, __fmul_rn(load((const u16*)PICK(s, k), i, KIND == 1), scale));
            ((u16*)dst)[i] = to_half(a, KIND == 1);
        }
    }
}
extern "C" __global__ void __launch_bounds__(THREADS_MANY_PER_CTA) reduce_vec_f32(void* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_vec<0, 0>(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale);
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_vec2_f32(void* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_vec<0, 1>(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale);
}
extern "C" __global__ void __launch_bounds__(THREADS_MANY_PER_CTA) reduce_vec_bf16(void* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_vec<1, 0>(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale);
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_vec2_bf16(void* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_vec<1, 1>(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale);
}
extern "C" __global__ void __launch_bounds__(THREADS_MANY_PER_CTA) reduce_vec_f16(void* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_vec<2, 0>(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale);
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_vec2_f16(void* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_vec<2, 1>(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale);
}

// 16-bit operands summed into an fp32 result (FSDP2's bf16 gradients reduced in fp32): the
// same arithmetic as the fp32 kernels on the operands widened (exact), so the same bits as
// widening first and reducing in fp32. 8 elements per 16-byte load, two 16-byte stores; any
// misaligned pointer (never in a workspace slot or FSDP's buffers) takes the scalar loop for all.
template <int KIND> __device__ __forceinline__ void reduce_wide(float* dst, OPERANDS, int nsrc, long long n, float scale) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    unsigned long long any = (unsigned long long)dst;
    for (int k = 0; k < nsrc; ++k) any |= (unsigned long long)PICK(s, k);
    const long long nvec = (any & 15) ? 0 : n / 8;
    for (long long i = tid; i < nvec; i += stride) {
        float acc[8], f[8];
        unpack<KIND>(LDV((const uint4*)s0 + i), acc);
        #pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = __fmul_rn(acc[e], scale);
        for (int k = 1; k < nsrc; ++k) {
            unpack<KIND>(LDV((const uint4*)PICK(s, k) + i), f);
            #pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], __fmul_rn(f[e], scale));
        }
        STV((uint4*)dst + 2 * i, pack<0>(acc));
        STV((uint4*)dst + 2 * i + 1, pack<0>(acc + 4));
    }
    for (long long i = nvec * 8 + tid; i < n; i += stride) {
        float a = __fmul_rn(load((const u16*)s0, i, KIND == 1), scale);
        for (int k = 1; k < nsrc; ++k) a = __fadd_rn(a, __fmul_rn(load((const u16*)PICK(s, k), i, KIND == 1), scale));
        dst[i] = a;
    }
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_wide_bf16(float* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_wide<1>(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale);
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_wide_f16(float* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_wide<2>(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale);
}

// Any alignment: one element per thread and step.
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_f32(float* dst, OPERANDS, int nsrc, long long n, float scale) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float acc = __fmul_rn(load((const float*)s0, i), scale);
        for (int k = 1; k < nsrc; ++k) acc = __fadd_rn(acc, __fmul_rn(load((const float*)PICK(s, k), i), scale));
        dst[i] = acc;
    }
}

__device__ __forceinline__ void reduce_half(u16* dst, OPERANDS, int nsrc, long long n, float scale, int bf16) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float acc = __fmul_rn(load((const u16*)s0, i, bf16), scale);
        for (int k = 1; k < nsrc; ++k) acc = __fadd_rn(acc, __fmul_rn(load((const u16*)PICK(s, k), i, bf16), scale));
        dst[i] = to_half(acc, bf16);
    }
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_bf16(u16* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_half(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale, 1);
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_f16(u16* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_half(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale, 0);
}
