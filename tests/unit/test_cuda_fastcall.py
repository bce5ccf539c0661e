"""No-device tier: the ctypes route of the compiled programs' driver calls
(conccl.executors.cuda_fastcall): the arrays it builds once, the values it patches per call, and
that a compiled program takes it, with the stream's raw handle, wherever it is available.
The GPU tier (tests/gpu/test_gpu_fastcall.py) checks what the calls do on a device."""
from __future__ import annotations

import ctypes

import pytest

from conccl.executors import cuda_fastcall as fastcall
from conccl.executors import cuda_program
from conccl.executors.cuda_program import CopyBatch, CopyStep, SignalBatch, SignalStep


class _Params:
    """Stands for a cuda-python CUstreamBatchMemOpParams: 48 bytes whose address getPtr() gives."""

    def __init__(self, fill: int):
        self.raw = (ctypes.c_char * 48)(*([fill] * 48))

    def getPtr(self):  # noqa: N802 - cuda-python's name
        return ctypes.addressof(self.raw)


def _fake_functions(calls):
    def batch(stream, count, address, flags):
        calls.append(("batch", stream, count, ctypes.string_at(address, 48 * count), flags))
        return 0

    def copies(dsts, srcs, sizes, count, attrs, index, nattrs, stream):
        def read(addr, kind):
            return list((kind * count).from_address(addr))

        calls.append(("copies", stream, read(dsts, ctypes.c_uint64), read(srcs, ctypes.c_uint64),
                      read(sizes, ctypes.c_size_t), list((ctypes.c_size_t * 1).from_address(index)), nattrs))
        return 0

    def copy(dst, src, nbytes, stream):
        calls.append(("copy", stream, dst, src, nbytes))
        return 0

    return {"cuStreamBatchMemOp": batch, "cuMemcpyBatchAsync": copies, "cuMemcpyAsync": copy}


class _Cu:
    class CUmemcpySrcAccessOrder:  # noqa: N801
        CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1


def test_a_signal_batch_copies_the_structs_once_and_writes_each_calls_values_in_place(monkeypatch):
    calls = []
    monkeypatch.setattr(fastcall, "_functions", lambda: _fake_functions(calls))
    params = [_Params(0x11), _Params(0x22), _Params(0x33)]
    fast = fastcall.SignalBatchFast(_Cu, params, [(0, 0), (2, -1)])  # op 1 keeps its own value
    params[0].raw[20] = b"\x7f"  # the source changes after the copy: the call must not see it
    for seq, stream in ((5, 7), (0, 9)):
        assert fast.launch(stream, seq) == 0
        kind, got_stream, count, raw, flags = calls[-1]
        assert (kind, got_stream, count, flags) == ("batch", stream, 3, 0)
        ops = [raw[i * 48:(i + 1) * 48] for i in range(3)]
        assert int.from_bytes(ops[0][16:20], "little") == seq
        assert int.from_bytes(ops[2][16:20], "little") == (seq - 1) & 0xFFFFFFFF  # 0 - 1 wraps
        assert ops[1] == b"\x22" * 48
        # every byte but the patched value is the struct's as it was copied
        assert ops[0][:16] + ops[0][20:] == b"\x11" * 44 and ops[2][:16] + ops[2][20:] == b"\x33" * 44


def test_a_copy_batch_passes_arrays_of_its_copies_in_stream_order(monkeypatch):
    calls = []
    monkeypatch.setattr(fastcall, "_functions", lambda: _fake_functions(calls))
    fast = fastcall.CopyBatchFast(_Cu, [(0x1000, 0x2000, 64), (0x3000, 0x4000, 1 << 33)])
    assert fast.launch(11) == 0
    assert calls == [("copies", 11, [0x1000, 0x3000], [0x2000, 0x4000], [64, 1 << 33], [0], 1)]
    attrs = fast._arrays[3]
    assert ctypes.sizeof(attrs) == 24 and attrs.src_access_order == 1  # CUmemcpyAttributes, stream order


def test_the_route_is_off_where_asked_or_where_libcuda_is_missing(monkeypatch):
    fastcall._functions.cache_clear()
    try:
        monkeypatch.setenv("CONCCL_DRIVER_CALLS", "cuda-python")
        assert not fastcall.available()
        fastcall._functions.cache_clear()
        monkeypatch.delenv("CONCCL_DRIVER_CALLS")
        monkeypatch.setattr(ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name)))
        assert not fastcall.available()
    finally:
        fastcall._functions.cache_clear()


class _Recorder:
    """Stands for the fast classes: records how the program made them and calls them."""

    def __init__(self, log, kind, *args):
        self.log, self.kind, self.args = log, kind, args
        log.append(("made", kind, args))

    def launch(self, *args):
        self.log.append(("launch", self.kind, args))
        return self.log_result.pop(0) if getattr(self, "log_result", None) else 0


def test_a_compiled_program_takes_the_ctypes_route_with_the_raw_stream_handle(monkeypatch):
    from test_cuda_program import _RecordingDriver

    log = []
    monkeypatch.setattr(fastcall, "available", lambda: True)
    monkeypatch.setattr(fastcall, "SignalBatchFast", lambda cu, params, patches: _Recorder(log, "batch", patches))
    monkeypatch.setattr(fastcall, "CopyBatchFast", lambda cu, copies: _Recorder(log, "copies", tuple(copies)))
    monkeypatch.setattr(fastcall, "CopyFast", lambda d, s, n: _Recorder(log, "copy", (d, s, n)))
    lowered = ((SignalBatch((SignalStep(True, 0x100, 0), SignalStep(False, 0x204, 1))),
                CopyBatch((CopyStep(0x10, 0x20, 4), CopyStep(0x30, 0x40, 8))), CopyStep(0x50, 0x60, 2),
                SignalStep(False, 0x208, 2)),)
    cu = _RecordingDriver()
    program = cuda_program.CompiledProgram(lowered, cu, 0)
    assert [e for e in log if e[0] == "made"] == [
        ("made", "batch", ([(0, 0), (1, 1)],)), ("made", "copies", (((0x10, 0x20, 4), (0x30, 0x40, 8)),)),
        ("made", "copy", ((0x50, 0x60, 2),))]
    log.clear()
    program.launch_slot(0, "cu stream", 42, handle=0xABC)
    assert log == [("launch", "batch", (0xABC, 42)), ("launch", "copies", (0xABC,)), ("launch", "copy", (0xABC,))]
    # a single signal (a driver without batches) stays cuda-python's call
    assert cu.calls == [("single", "cu stream", ((False, 0x208, 44, "fenced"),))]


def test_a_failed_ctypes_call_is_named_with_its_slot_and_step(monkeypatch):
    def check(err):
        raise RuntimeError(f"CUDA driver error {err}")

    class _Failing:
        def __init__(self, *args):
            pass

        def launch(self, *args):
            return 700  # CUDA_ERROR_ILLEGAL_ADDRESS

    monkeypatch.setattr(fastcall, "available", lambda: True)
    monkeypatch.setattr(fastcall, "CopyFast", _Failing)
    monkeypatch.setattr(cuda_program, "check", check)
    monkeypatch.setattr(cuda_program, "driver", lambda: type("cu", (), {"CUresult": staticmethod(lambda e: f"<{e}>")}))
    from test_cuda_program import _RecordingDriver

    program = cuda_program.CompiledProgram(((CopyStep(1, 2, 3), CopyStep(4, 5, 6)),), _RecordingDriver(), 0)
    with pytest.raises(RuntimeError, match=r"error <700> in cuMemcpyAsync of 3 bytes \(slot 0, step 0 of 2\)"):
        program.launch_slot(0, "s", 1, handle=5)
