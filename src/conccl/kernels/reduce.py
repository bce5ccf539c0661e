"""The reduction kernel (``kernels/cuda/reduce.cu``): an elementwise sum of up to 8 operands
over a bounded grid.

A reducing collective (reduce-scatter, all-reduce) moves every byte with copy engines and then
needs ``dst = sum(scale * src_k)`` over the chunks that arrived. This kernel does that with a
grid of at most half the GPU's SMs (:func:`grid_bound`; a grid-stride loop): the grid that costs
a GEMM running beside it least per sum. Compiled once per process and device by
:mod:`conccl.kernels.loader`; bf16 and fp16 are converted with bit operations and PTX ``cvt``
(``conccl.cuh``).

Arithmetic (what the CPU reference executor does too, bit for bit): every operand is
converted to fp32 and multiplied by ``scale`` (``__fmul_rn``), the products are added in the
order given (``__fadd_rn``: never fused into an FMA), and the sum is rounded to the dtype
once (round to nearest even).
"""
from __future__ import annotations

import ctypes
import functools

from ..device.driver import check, driver
from ..schedule.base import ELEMENT_BYTES
from . import loader

MAX_OPERANDS = 8  # world sizes up to 8, as an NVLink node has


# The grid. Beside a GEMM, a sum costs it HBM bandwidth and SMs for as long as it runs, so a
# grid too small to stream near HBM's rate costs the GEMM more per sum, not less. One H200,
# a loop of bf16 8192^3 GEMMs beside the sum of a 1 GiB 2-rank reduce-scatter, GEMM time lost
# per sum in three runs: 32 CTAs 0.25-0.29 ms, 48 0.14, 66 0.12, 96 and 132 0.13 (512 MiB:
# 0.08-0.10, 0.04, 0.033, 0.04); half the SMs it is.
@functools.lru_cache(maxsize=None)
def grid_bound(device_index: int) -> int:
    """CTAs the reduction (and the other grid-stride kernels: MoE's gathered sum and row
    packing) may take on this GPU: half its SMs (66 on the 132-SM H100 SXM and H200), at least 1."""
    cu = driver()
    sms = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                        check(cu.cuDeviceGet(device_index))))
    return max(1, int(sms) // 2)


# Bytes in flight per CTA (threads x UNROLL vectors per operand, reduce.cu) set the sum's speed
# and what it takes from a GEMM beside it; the register budget of a thread sets what fits. One
# H200, 66 CTAs:
# * two operands (the pair kernels): the sum of a 1 GiB 2-rank bf16 reduce-scatter beside a GEMM
#   loop, the order rotated, cost the GEMMs 0.120-0.136 ms per sum at 512 threads x UNROLL 8 with
#   plain loads and stores, 0.099-0.120 at 1024 x 2 evict-first (this; the sum alone 0.46-0.52
#   ms, 0-9% slower run by run), 0.09-0.10 for a full-grid torch.add (0.37-0.38 ms alone);
# * one, or three or more operands, read one after another (the general kernels): 8 operands of
#   256 MiB alone took 0.71 ms at 512 x 8 evict-first (this), 0.80 at 1024 x 2, 1.0-1.9 at 1024
#   x 4 or 8; with plain loads under the 512-thread bound, 1.8 ms.
THREADS = 1024  # the pair, the wide and the scalar kernels
THREADS_MANY = 512  # the general vector kernels
# reduce.cu's options: every kernel's __launch_bounds__ is the CTA it is launched with.
DEFINES = {"THREADS_PER_CTA": THREADS, "THREADS_MANY_PER_CTA": THREADS_MANY}

_KERNELS = {"float32": "reduce_f32", "bfloat16": "reduce_bf16", "float16": "reduce_f16"}
_VECTOR = {dtype: name.replace("reduce_", "reduce_vec_") for dtype, name in _KERNELS.items()}
_PAIR = {dtype: name.replace("reduce_", "reduce_vec2_") for dtype, name in _KERNELS.items()}  # two operands
_WIDE = {"bfloat16": "reduce_wide_bf16", "float16": "reduce_wide_f16"}  # 16-bit operands, fp32 result


@functools.lru_cache(maxsize=None)
def _functions(device_index: int):
    """(scalar, vector, pair, wide): {dtype: CUfunction} each, on ``device_index``'s primary
    context (current when torch runs there)."""
    def get(names: dict) -> dict:
        return {dtype: loader.function(device_index, "reduce", name, DEFINES) for dtype, name in names.items()}

    return get(_KERNELS), get(_VECTOR), get(_PAIR), get(_WIDE)


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
        scalar, vector, pair, wide = _functions(device_index)
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
