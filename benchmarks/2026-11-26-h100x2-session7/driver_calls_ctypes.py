"""Tried in session 7 and not shipped (run1: no faster than cuda-python; the driver itself costs
the time): the compiled programs' hot driver calls through ctypes, their arrays built once.

cuda-python converts a list argument (a ``cuStreamBatchMemOp``'s parameter structs, a
``cuMemcpyBatchAsync``'s pointer and size lists) into a fresh C array at every call: a settled
eager call spent 17-33 us of host time in its 3-5 driver calls (issue 38, ``bench.latency
--phases`` on 2 x H200). Here each call's arrays are ctypes memory made once; a call writes
its sequence number into the signal values in place and calls the driver function the
driver itself hands out (``cuGetProcAddress``, at the CUDA version cuda-python's binding
was made for), so the signatures are those cuda-python calls. The structs are cuda-python's
own, copied byte for byte (their layout is read from them, not assumed), so both routes queue
the same operations; ``scripts/driver_call_probe.py`` times both and checks what they did.

Where libcuda or a symbol is not found, :func:`available` is False and the programs keep
cuda-python's calls (``CONCCL_DRIVER_CALLS=cuda-python`` asks for them too).
"""
from __future__ import annotations

import ctypes
import functools
import os

from conccl.executors.cuda_graph_launch import driver_functions

# cuGetProcAddress: the CUDA version whose signature of each function we call. Batch memory
# ops took their current parameter struct in 11.7; cuMemcpyBatchAsync lost its failIdx in 13.0
# (cuda-python 13's binding, which conccl's calls follow, has none).
_VERSIONS = {"cuStreamBatchMemOp": 12000, "cuMemcpyBatchAsync": 13000, "cuMemcpyAsync": 12000}
_PARAM_BYTES = 48  # sizeof(CUstreamBatchMemOpParams): a union padded to 6 x 64 bits
_VALUE_OFFSET = 16  # of the 32-bit value in a wait or write op (checked against cuda-python's struct)
_u64, _size = ctypes.c_uint64, ctypes.c_size_t


@functools.lru_cache(maxsize=1)
def _functions() -> dict | None:
    """{name: ctypes function} for :data:`_VERSIONS`, or None where any is missing."""
    if os.environ.get("CONCCL_DRIVER_CALLS", "ctypes") == "cuda-python":
        return None
    kinds = {"cuStreamBatchMemOp": [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint],
             "cuMemcpyBatchAsync": [ctypes.c_void_p] * 3 + [_size, ctypes.c_void_p, ctypes.c_void_p, _size,
                                                            ctypes.c_void_p],
             "cuMemcpyAsync": [_u64, _u64, _size, ctypes.c_void_p]}
    return driver_functions({name: (version, kinds[name]) for name, version in _VERSIONS.items()})


def available() -> bool:
    """Whether the ctypes route can be taken (libcuda and every function found)."""
    return _functions() is not None


class SignalBatchFast:
    """One ``cuStreamBatchMemOp`` of cuda-python ``CUstreamBatchMemOpParams`` ``params``, copied
    once into one C array; ``patches``: (op index, delta) of the ops whose value is the call's
    sequence number plus delta, written in place at each :meth:`launch`."""

    __slots__ = ("_fn", "_array", "_address", "_count", "_values")

    def __init__(self, cu, params, patches):
        self._fn = _functions()["cuStreamBatchMemOp"]
        self._count = len(params)
        self._array = (ctypes.c_char * (_PARAM_BYTES * self._count))()
        for i, p in enumerate(params):
            ctypes.memmove(ctypes.addressof(self._array) + i * _PARAM_BYTES, p.getPtr(), _PARAM_BYTES)
        self._address = ctypes.addressof(self._array)
        self._values = tuple((ctypes.c_uint32.from_buffer(self._array, i * _PARAM_BYTES + _VALUE_OFFSET), delta)
                             for i, delta in patches)

    def launch(self, stream: int, seq: int) -> int:
        for value, delta in self._values:
            value.value = (seq + delta) & 0xFFFFFFFF
        return self._fn(stream, self._count, self._address, 0)


def check_value_offset(cu) -> None:
    """Raise unless a cuda-python wait and write op hold their value where :class:`SignalBatchFast`
    writes it (a binding with another layout must not be patched blindly)."""
    for op, sub_name in ((cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32, "waitValue"),
                         (cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32, "writeValue")):
        p = cu.CUstreamBatchMemOpParams()
        p.operation = op
        sub = getattr(p, sub_name)
        sub.operation, sub.value = op, 0x5A3C96E1
        raw = ctypes.string_at(p.getPtr(), _PARAM_BYTES)
        if int.from_bytes(raw[_VALUE_OFFSET:_VALUE_OFFSET + 4], "little") != 0x5A3C96E1:
            raise RuntimeError("cuda-python's CUstreamBatchMemOpParams holds its value elsewhere")


class _CopyAttributes(ctypes.Structure):
    # CUmemcpyAttributes: srcAccessOrder, srcLocHint {type, id}, dstLocHint {type, id}, flags
    _fields_ = [("src_access_order", ctypes.c_int), ("src_type", ctypes.c_int), ("src_id", ctypes.c_int),
                ("dst_type", ctypes.c_int), ("dst_id", ctypes.c_int), ("flags", ctypes.c_uint)]


class CopyBatchFast:
    """One ``cuMemcpyBatchAsync`` of ``copies`` ((dst, src, nbytes) each), every copy ordered
    after the stream's earlier work (``CU_MEMCPY_SRC_ACCESS_ORDER_STREAM``), as
    :mod:`conccl.executors.cuda_program`'s cuda-python call asks."""

    __slots__ = ("_fn", "_arrays", "_args")

    def __init__(self, cu, copies):
        self._fn = _functions()["cuMemcpyBatchAsync"]
        n = len(copies)
        dsts, srcs, sizes = (_u64 * n)(*(c[0] for c in copies)), (_u64 * n)(*(c[1] for c in copies)), \
            (_size * n)(*(c[2] for c in copies))
        attrs = _CopyAttributes(int(cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM), 0, 0, 0, 0, 0)
        index = (_size * 1)(0)
        self._arrays = (dsts, srcs, sizes, attrs, index)  # kept alive: the driver reads them at each call
        self._args = (ctypes.addressof(dsts), ctypes.addressof(srcs), ctypes.addressof(sizes), n,
                      ctypes.addressof(attrs), ctypes.addressof(index), 1)

    def launch(self, stream: int) -> int:
        return self._fn(*self._args, stream)


class CopyFast:
    """One ``cuMemcpyAsync`` of ``nbytes`` from ``src`` to ``dst``."""

    __slots__ = ("_fn", "_args")

    def __init__(self, dst: int, src: int, nbytes: int):
        self._fn = _functions()["cuMemcpyAsync"]
        self._args = (dst, src, nbytes)

    def launch(self, stream: int) -> int:
        return self._fn(*self._args, stream)
