"""The few CUDA driver calls PyTorch does not expose, through cuda-python.

Stream memory operations (``cuStreamWriteValue32`` / ``cuStreamWaitValue32``) are executed by
the GPU's front end, not by SMs, and so are the copies (``cuMemcpyAsync``,
``cuMemcpyBatchAsync``): nothing here launches a kernel but :func:`launch`, for the few SM kernels
conccl has (compiled by :mod:`conccl.kernels.loader`).
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def driver():
    try:
        from cuda.bindings import driver as cu  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cuda as cu  # older cuda-python
        except ImportError as e:
            raise ImportError(
                "conccl's copy-engine executor needs cuda-python (the `cuda.bindings` package)"
            ) from e
    return cu


def check(result):
    """cuda-python returns (CUresult, *values); raise on error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    values = [v for v in values if v is not None]
    cu = driver()
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver error {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else values


def signal_flags(cu) -> tuple:
    """(wait flags, write flags) of every signal operation.

    Waits are GEQ: ``(int32)(*addr - value) >= 0``, so sequence numbers may wrap around.
    Writes take the default flags, which put a system-scope fence before the write: a peer
    that sees the signal also sees every copy the stream issued before it.
    """
    return cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ, cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT


class StreamOps:
    """Signal writes bound to one stream handle (``torch.cuda.Stream.cuda_stream``): what the
    watchdog uses to release stuck waits. Collectives run compiled programs
    (:mod:`conccl.executors.cuda.program`)."""

    def __init__(self, stream_handle: int):
        cu = driver()
        self.cu = cu
        self.stream = cu.CUstream(stream_handle)
        self._write = signal_flags(cu)[1]

    def write_value32(self, addr: int, value: int) -> None:
        check(self.cu.cuStreamWriteValue32(self.stream, self.cu.CUdeviceptr(addr), value & 0xFFFFFFFF, self._write))


def launch(function, grid: int, threads: int, shared: int, stream_handle: int, values: list) -> None:
    """One launch of ``function`` (a ``CUfunction``) with the ctypes ``values`` as its
    parameters, on the stream with raw handle ``stream_handle``; raises on an error. For kernels
    launched with new arguments each call (the prebuilt launches keep their parameters)."""
    import ctypes

    cu = driver()
    if shared > 48 * 1024:  # beyond the default dynamic shared memory: opt in
        check(cu.cuFuncSetAttribute(function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    shared))
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    check(cu.cuLaunchKernel(function, grid, 1, 1, threads, 1, 1, shared, stream_handle, ctypes.addressof(params), 0))
