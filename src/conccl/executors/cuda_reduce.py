"""The one SM kernel conccl runs: an elementwise reduction of up to 8 operands, bounded CTAs.

A reducing collective (reduce-scatter, all-reduce) moves every byte with copy engines and
then needs ``dst = sum(scale * src_k)`` over the chunks that arrived. This kernel does that
with a grid of at most :data:`MAX_CTAS` blocks (a grid-stride loop), so a GEMM running
beside it keeps all but that many SMs. Compiled once per process with NVRTC (cuda-python),
without headers: bf16 and fp16 are converted with bit operations and PTX ``cvt``.

Arithmetic (what the CPU reference executor does too, bit for bit): every operand is
converted to fp32 and multiplied by ``scale`` (``__fmul_rn``), the products are added in the
order given (``__fadd_rn``: never fused into an FMA), and the sum is rounded to the dtype
once (round to nearest even).
"""
from __future__ import annotations

import ctypes
import functools

from .._driver import check, driver

MAX_OPERANDS = 8  # world sizes up to 8, as an NVLink node has
MAX_CTAS = 16  # SMs the reduction may occupy at once
THREADS = 512

_SOURCE = r"""
typedef unsigned short u16;
typedef unsigned int u32;

__device__ __forceinline__ float load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float load(const u16* p, long long i, int bf16) {
    u16 h = p[i];
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

#define OPERANDS const void* s0, const void* s1, const void* s2, const void* s3, \
                 const void* s4, const void* s5, const void* s6, const void* s7
#define PICK(k) ((k) == 0 ? s0 : (k) == 1 ? s1 : (k) == 2 ? s2 : (k) == 3 ? s3 : \
                 (k) == 4 ? s4 : (k) == 5 ? s5 : (k) == 6 ? s6 : s7)

extern "C" __global__ void reduce_f32(float* dst, OPERANDS, int nsrc, long long n, float scale) {
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
extern "C" __global__ void reduce_bf16(u16* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_half(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale, 1);
}
extern "C" __global__ void reduce_f16(u16* dst, OPERANDS, int nsrc, long long n, float scale) {
    reduce_half(dst, s0, s1, s2, s3, s4, s5, s6, s7, nsrc, n, scale, 0);
}
"""

_KERNELS = {"float32": ("reduce_f32", 4), "bfloat16": ("reduce_bf16", 2), "float16": ("reduce_f16", 2)}


@functools.lru_cache(maxsize=None)
def _module(device_index: int):
    """The compiled module on ``device_index``'s primary context (current when torch runs there)."""
    from cuda.bindings import nvrtc  # optional dependency: loaded where a reduction first runs

    cu = driver()
    _, dev = cu.cuDeviceGet(device_index)
    major = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    err, prog = nvrtc.nvrtcCreateProgram(_SOURCE.encode(), b"conccl_reduce.cu", 0, [], [])
    _nvrtc_check(nvrtc, err)
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode(), b"--std=c++17"]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"conccl: compiling the reduction kernel failed:\n{log.decode(errors='replace')}")
    _, size = nvrtc.nvrtcGetPTXSize(prog)
    ptx = b" " * size
    _nvrtc_check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx)[0])
    nvrtc.nvrtcDestroyProgram(prog)
    module = check(cu.cuModuleLoadData(ptx))
    return module, {dtype: check(cu.cuModuleGetFunction(module, name.encode())) for dtype, (name, _) in _KERNELS.items()}


def _nvrtc_check(nvrtc, err) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"conccl: NVRTC error {err}")


class ReduceLaunch:
    """One prebuilt launch of the reduction: ``dst = sum(scale * src)`` over ``nbytes`` each."""

    def __init__(self, device_index: int, dst: int, srcs: tuple[int, ...], nbytes: int, dtype: str, scale: float):
        if not 1 <= len(srcs) <= MAX_OPERANDS:
            raise ValueError(f"the reduction takes 1 to {MAX_OPERANDS} operands, got {len(srcs)}")
        _, esize = _KERNELS[dtype]
        n = nbytes // esize
        self.function = _module(device_index)[1][dtype]
        self.grid = max(1, min(MAX_CTAS, -(-n // THREADS)))
        ptrs = list(srcs) + [srcs[0]] * (MAX_OPERANDS - len(srcs))  # unused operands are never read
        # The kernel's parameters, kept alive with the program: the driver copies them at launch.
        self._values = ([ctypes.c_void_p(dst)] + [ctypes.c_void_p(p) for p in ptrs]
                        + [ctypes.c_int(len(srcs)), ctypes.c_longlong(n), ctypes.c_float(scale)])
        self._params = (ctypes.c_void_p * len(self._values))(*[ctypes.addressof(v) for v in self._values])
        self.params = ctypes.addressof(self._params)

    def launch(self, cu, stream):
        return cu.cuLaunchKernel(self.function, self.grid, 1, 1, THREADS, 1, 1, 0, stream, self.params, 0)
