"""A gathered, weighted sum of rows as one bounded SM kernel (``kernels/cuda/gather_sum.cu``):
MoE combine's arithmetic.

``out[r] = round(sum over j = 0..n-1 with index[r, j] >= 0 of weights[r, j] * float(src[index[r, j]]))``

for rows ``r`` of ``out`` [R, H], ``index`` [R, n] int64 (-1: no operand), ``weights`` [R, n]
fp32 or none (ones, and no multiply). Arithmetic exactly as the torch form in
:mod:`conccl.ep` (and the reference dispatcher) does it: an fp32 accumulator from
+0, each operand converted to fp32, multiplied by its weight (``__fmul_rn``), added in ``j``
order (``__fadd_rn``: never an FMA), rounded to the dtype once (nearest even). So the torch
form and this kernel give the same bits (on the GPU, -0 included; against the CPU's torch, all
but a NaN's sign and payload).

Why a kernel: the torch form is ``n`` gathers into fp32 ``[R, H]`` temporaries, a multiply, a
``where`` and an add each (about 1.5 GB of HBM traffic per slot for a 6400 x 7168 bf16 combine);
this reads each operand row once and writes ``out`` once. SMs: at most :func:`grid_bound`
CTAs (half the GPU's) of 512 threads, grid-stride; no workspace.
"""
from __future__ import annotations

import ctypes
import functools

from ..device.driver import launch
from . import loader
from .reduce import grid_bound

THREADS = 512

_NAMES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
DTYPES = tuple(_NAMES)
DEFINES = {"THREADS_PER_CTA": THREADS}  # gather_sum.cu's option: its kernels' __launch_bounds__


@functools.lru_cache(maxsize=None)
def _functions(device_index: int) -> dict:
    """{(dtype, vector rows): CUfunction} on ``device_index``'s primary context."""
    return {(dtype, vec): loader.function(device_index, "gather_sum", f"gather_sum_{'vec_' if vec else ''}{tag}",
                                          DEFINES)
            for dtype, tag in _NAMES.items() for vec in (False, True)}


def gather_sum(out, src, index, weights=None):
    """``out`` [R, H] = the gathered, weighted row sums of ``src`` [S, H] (module doc), on
    torch's current stream (where the tensors were made), asynchronous; ``out`` returned. ``out`` and
    ``src`` contiguous CUDA tensors of one dtype (fp32, bf16, fp16) on one device, ``index``
    contiguous int64 [R, n], ``weights`` contiguous fp32 [R, n] or None."""
    import torch

    dtype = str(src.dtype).removeprefix("torch.")
    if dtype not in _NAMES or out.dtype != src.dtype:
        raise ValueError(f"gather_sum: out and src must share one of {', '.join(DTYPES)}, got {out.dtype}, {src.dtype}")
    rows, n = index.shape
    h = src.shape[1] if src.dim() == 2 else 0
    if out.shape != (rows, h) or index.dtype != torch.int64 or (weights is not None and (
            weights.dtype != torch.float32 or weights.shape != index.shape)):
        raise ValueError(f"gather_sum: out {tuple(out.shape)}, src {tuple(src.shape)}, index {tuple(index.shape)} "
                         f"{index.dtype}, weights {None if weights is None else (tuple(weights.shape), weights.dtype)}")
    for t in (out, src, index, weights):
        if t is not None and not (t.is_cuda and t.is_contiguous()):
            raise ValueError("gather_sum: every tensor must be a contiguous CUDA tensor")
    if rows == 0 or h == 0:
        return out
    esize = src.element_size()
    vec = (h * esize) % 16 == 0 and src.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0
    device_index = src.device.index
    fn = _functions(device_index)[(dtype, vec)]
    total = rows * (h // (16 // esize) if vec else h)
    grid = max(1, min(grid_bound(device_index), -(-total // THREADS)))
    values = [ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(src.data_ptr()), ctypes.c_void_p(index.data_ptr()),
              ctypes.c_void_p(0 if weights is None else weights.data_ptr()), ctypes.c_int(n), ctypes.c_longlong(rows),
              ctypes.c_longlong(h)]
    launch(fn, grid, THREADS, 0, torch.cuda.current_stream(src.device).cuda_stream, values)
    return out
