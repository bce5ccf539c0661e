"""The one SM kernel conccl runs: an elementwise reduction of up to 8 operands, bounded CTAs.

A reducing collective (reduce-scatter, all-reduce) moves every byte with copy engines and
then needs ``dst = sum(scale * src_k)`` over the chunks that arrived. This kernel does that
with a grid of at most half the GPU's SMs (:func:`grid_bound`; a grid-stride loop): the grid
that costs a GEMM running beside it least per sum. Compiled once per process with NVRTC (cuda-python),
without headers: bf16 and fp16 are converted with bit operations and PTX ``cvt``.

Arithmetic (what the CPU reference executor does too, bit for bit): every operand is
converted to fp32 and multiplied by ``scale`` (``__fmul_rn``), the products are added in the
order given (``__fadd_rn``: never fused into an FMA), and the sum is rounded to the dtype
once (round to nearest even).
"""
from __future__ import annotations

import ctypes
import functools
import os

from ..device.driver import check, driver, load_module
from ..schedule.base import ELEMENT_BYTES

MAX_OPERANDS = 8  # world sizes up to 8, as an NVLink node has
# The grid. Beside a GEMM, a sum costs it HBM bandwidth and SMs for as long as it runs, so a
# grid too small to stream near HBM's rate costs the GEMM more per sum, not less. One H200,
# a loop of bf16 8192^3 GEMMs beside the sum of a 1 GiB 2-rank reduce-scatter, GEMM time lost
# per sum in three runs (benchmarks/2026-11-23-h200-reduce-beside-gemm): 32 CTAs 0.25-0.29 ms,
# 48 0.14, 66 0.12, 96 and 132 0.13 (512 MiB: 0.08-0.10, 0.04, 0.033, 0.04); half the SMs it
# is. CONCCL_REDUCE_CTAS overrides it (experiments: the 2-GPU benchmark compares grids with the
# copies included).
def _grid_env() -> int | None:
    """``CONCCL_REDUCE_CTAS`` as a number (None: unset). Read where a reduction is first built,
    not at import: a bad value must not break what runs without a GPU."""
    raw = os.environ.get("CONCCL_REDUCE_CTAS", "")
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 1024:
        raise ValueError(f"CONCCL_REDUCE_CTAS must be a whole number from 1 to 1024, got {raw!r}")
    return int(raw)


@functools.lru_cache(maxsize=None)
def grid_bound(device_index: int) -> int:
    """CTAs the reduction may take on this GPU: ``CONCCL_REDUCE_CTAS``, else half its SMs (66 on
    the 132-SM H100 SXM and H200)."""
    override = _grid_env()
    if override is not None:
        return override
    cu = driver()
    sms = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                        check(cu.cuDeviceGet(device_index))))
    return max(1, int(sms) // 2)


# Bytes in flight per CTA (threads x UNROLL vectors per operand) set the sum's speed and what it
# takes from a GEMM beside it; the register budget of a thread sets what fits. One H200, 66 CTAs
# (benchmarks/2026-11-23-h200-reduce-variants and its reduce_variants.py):
# * two operands (the pair kernels): the sum of a 1 GiB 2-rank bf16 reduce-scatter beside a GEMM
#   loop, the order rotated, cost the GEMMs 0.120-0.136 ms per sum at 512 threads x UNROLL 8 with
#   plain loads and stores, 0.099-0.120 at 1024 x 2 evict-first (this; the sum alone 0.46-0.52
#   ms, 0-9% slower run by run), 0.09-0.10 for a full-grid torch.add (0.37-0.38 ms alone);
# * one, or three or more operands, read one after another (the general kernels): 8 operands of
#   256 MiB alone took 0.71 ms at 512 x 8 evict-first (this), 0.80 at 1024 x 2, 1.0-1.9 at 1024
#   x 4 or 8; with plain loads under the 512-thread bound, 1.8 ms.
THREADS = 1024  # the pair and the scalar kernels
THREADS_MANY = 512  # the general vector kernels

# The bf16/fp16 conversions and 16-byte (un)packing every sum uses, shared with the one-shot
# kernel (conccl.kernels.one_shot): one text, so both round alike.
CONVERSIONS = r"""
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
"""

_SOURCE = r"""
typedef unsigned short u16;
typedef unsigned int u32;
#ifndef UNROLL
#define UNROLL 2  // 16-byte vectors in flight per thread and operand, two operands (see THREADS)
#endif
#ifndef UNROLL_MANY
#define UNROLL_MANY 8  // the same for three or more operands, read one after the other
#endif
// The vector kernels' loads and stores: every operand is read once and the result written
// once, so they go through L2 marked evict-first and leave what a GEMM beside them keeps there
// (beside a GEMM about as good as plain ones at 1024 x 2, within the noise; under the general
// kernels' 512-thread bound 2.5x faster than plain loads: see THREADS). The load's asm is not
// volatile and touches memory the compiler does not see: correct because every element is read
// and written by one thread, each store after the loads it depends on, dst never re-read (an
// in-place sum has dst == s0). benchmarks/2026-11-23-h200-reduce-variants tried others in their place.
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
#ifndef LDV
#define LDV(p) ld_evict_first(p)
#endif
#ifndef STV
#define STV(p, v) st_evict_first(p, v)
#endif

""" + CONVERSIONS + r"""
__device__ __forceinline__ float load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float load(const u16* p, long long i, int bf16) { return half_to_float(p[i], bf16); }

#define OPERANDS const void* s0, const void* s1, const void* s2, const void* s3, \
                 const void* s4, const void* s5, const void* s6, const void* s7
#define PICK(k) ((k) == 0 ? s0 : (k) == 1 ? s1 : (k) == 2 ? s2 : (k) == 3 ? s3 : \
                 (k) == 4 ? s4 : (k) == 5 ? s5 : (k) == 6 ? s6 : s7)


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
            const uint4* p = (const uint4*)PICK(k);
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
            for (int k = 1; k < nsrc; ++k) a = __fadd_rn(a, __fmul_rn(load((const float*)PICK(k), i), scale));
            ((float*)dst)[i] = a;
        } else {
            float a = __fmul_rn(load((const u16*)s0, i, KIND == 1), scale);
            for (int k = 1; k < nsrc; ++k) a = __fadd_rn(a, __fmul_rn(load((const u16*)PICK(k), i, KIND == 1), scale));
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
    for (int k = 0; k < nsrc; ++k) any |= (unsigned long long)PICK(k);
    const long long nvec = (any & 15) ? 0 : n / 8;
    for (long long i = tid; i < nvec; i += stride) {
        float acc[8], f[8];
        unpack<KIND>(LDV((const uint4*)s0 + i), acc);
        #pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = __fmul_rn(acc[e], scale);
        for (int k = 1; k < nsrc; ++k) {
            unpack<KIND>(LDV((const uint4*)PICK(k) + i), f);
            #pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], __fmul_rn(f[e], scale));
        }
        STV((uint4*)dst + 2 * i, pack<0>(acc));
        STV((uint4*)dst + 2 * i + 1, pack<0>(acc + 4));
    }
    for (long long i = nvec * 8 + tid; i < n; i += stride) {
        float a = __fmul_rn(load((const u16*)s0, i, KIND == 1), scale);
        for (int k = 1; k < nsrc; ++k) a = __fadd_rn(a, __fmul_rn(load((const u16*)PICK(k), i, KIND == 1), scale));
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
        for (int k = 1; k < nsrc; ++k) acc = __fadd_rn(acc, __fmul_rn(load((const float*)PICK(k), i), scale));
        dst[i] = acc;
    }
}

__device__ __forceinline__ void reduce_half(u16* dst, OPERANDS, int nsrc, long long n, float scale, int bf16) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float acc = __fmul_rn(load((const u16*)s0, i, bf16), scale);
        for (int k = 1; k < nsrc; ++k) acc = __fadd_rn(acc, __fmul_rn(load((const u16*)PICK(k), i, bf16), scale));
        dst[i] = to_half(acc, bf16);
    }
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_bf16(u16* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_half(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale, 1);
}
extern "C" __global__ void __launch_bounds__(THREADS_PER_CTA) reduce_f16(u16* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_half(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale, 0);
}
"""

_KERNELS = {"float32": "reduce_f32", "bfloat16": "reduce_bf16", "float16": "reduce_f16"}
_VECTOR = {dtype: name.replace("reduce_", "reduce_vec_") for dtype, name in _KERNELS.items()}
_PAIR = {dtype: name.replace("reduce_", "reduce_vec2_") for dtype, name in _KERNELS.items()}  # two operands
_WIDE = {"bfloat16": "reduce_wide_bf16", "float16": "reduce_wide_f16"}  # 16-bit operands, fp32 result


@functools.lru_cache(maxsize=None)
def _module(device_index: int):
    """The compiled module on ``device_index``'s primary context (current when torch runs there)."""
    cu = driver()
    module = load_module(device_index, f"#define THREADS_PER_CTA {THREADS}\n#define THREADS_MANY_PER_CTA {THREADS_MANY}\n"
                         f"{_SOURCE}", "conccl_reduce.cu", "the reduction kernel")
    scalar = {dtype: check(cu.cuModuleGetFunction(module, name.encode())) for dtype, name in _KERNELS.items()}
    vector = {dtype: check(cu.cuModuleGetFunction(module, name.encode())) for dtype, name in _VECTOR.items()}
    pair = {dtype: check(cu.cuModuleGetFunction(module, name.encode())) for dtype, name in _PAIR.items()}
    wide = {dtype: check(cu.cuModuleGetFunction(module, name.encode())) for dtype, name in _WIDE.items()}
    return module, scalar, vector, pair, wide


class ReduceLaunch:
    """One prebuilt launch of the reduction: ``dst = sum(scale * src)`` over ``nbytes`` each
    (operands of ``dtype``; the result of ``out_dtype``, None: ``dtype``, or fp32 over 16-bit
    operands)."""

    def __init__(self, device_index: int, dst: int, srcs: tuple[int, ...], nbytes: int, dtype: str, scale: float,
                 out_dtype: str | None = None):
        if not 1 <= len(srcs) <= MAX_OPERANDS:
            raise ValueError(f"the reduction takes 1 to {MAX_OPERANDS} operands, got {len(srcs)}")
        widen = out_dtype not in (None, dtype)
        if widen and (out_dtype != "float32" or dtype not in _WIDE):
            raise ValueError(f"the reduction sums {dtype} into {dtype} or 16-bit operands into float32, "
                             f"not {dtype} into {out_dtype}")
        n = nbytes // ELEMENT_BYTES[dtype]
        _, scalar, vector, pair, wide = _module(device_index)
        # 16-byte vectors where every operand allows them (FSDP's buffers and the workspace's
        # slots do); otherwise one element at a time, at a fraction of the bandwidth.
        self.vectorized = all(p % 16 == 0 for p in (dst, *srcs))
        # The kernel and its CTA size chosen together: a launch larger than the kernel's
        # __launch_bounds__ is refused (one operand, a group of one, takes the general kernel).
        family, self.threads = ((wide, THREADS) if widen else (scalar, THREADS) if not self.vectorized
                                else (pair, THREADS) if len(srcs) == 2 else (vector, THREADS_MANY))
        self.function = family[dtype]
        self.grid = max(1, min(grid_bound(device_index), -(-n // self.threads)))
        ptrs = list(srcs) + [srcs[0]] * (MAX_OPERANDS - len(srcs))  # unused operands are never read
        # The kernel's parameters, kept alive with the program: the driver copies them at launch.
        self._values = ([ctypes.c_void_p(dst)] + [ctypes.c_void_p(p) for p in ptrs]
                        + [ctypes.c_int(len(srcs)), ctypes.c_longlong(n), ctypes.c_float(scale)])
        self._params = (ctypes.c_void_p * len(self._values))(*[ctypes.addressof(v) for v in self._values])
        self.params = ctypes.addressof(self._params)

    def launch(self, cu, stream):
        return cu.cuLaunchKernel(self.function, self.grid, 1, 1, self.threads, 1, 1, 0, stream, self.params, 0)
