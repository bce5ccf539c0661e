"""No-device tier: a compiled program re-addressed (conccl.executors.cuda.lowering.shape / CompiledProgram.readdressed,
what the CUDA executor does on a cache miss whose lowering has a known shape) makes the driver
calls a fresh compile of the new lowering makes, shares the template's signal calls, and leaves
the template's own calls as they were."""
from __future__ import annotations

from types import SimpleNamespace

from conccl.collectives.all_to_all import plan_all_to_all
from conccl.executors.cuda import program as cuda_program
from conccl.executors.cuda.program import CompiledProgram
from conccl.executors.cuda.lowering import lower, shape
from conccl.schedule.base import Algorithm, Buf, StreamMode

STRIDE, PAD = 1 << 40, 7 << 36


def _address(base):
    bases = {Buf.INPUT: base, Buf.OUTPUT: base + (2 << 36), Buf.WORKSPACE: 5 << 36}
    return lambda rank, buf: bases[buf] + rank * STRIDE


def _pads(world):
    return [PAD + r * STRIDE for r in range(world)]


class _Params:
    def __init__(self):
        self.waitValue, self.writeValue = SimpleNamespace(), SimpleNamespace()


def _fake_cu():
    """Enough of cuda.bindings.driver to build and launch programs: every call is recorded."""
    calls = []

    def rec(name):
        return lambda *args: calls.append((name, args)) or (0,)

    ns = SimpleNamespace
    cu = ns(CUstreamWaitValue_flags=ns(CU_STREAM_WAIT_VALUE_GEQ=1),
            CUstreamWriteValue_flags=ns(CU_STREAM_WRITE_VALUE_DEFAULT=0),
            CUstreamBatchMemOpType=ns(CU_STREAM_MEM_OP_WAIT_VALUE_32=1, CU_STREAM_MEM_OP_WRITE_VALUE_32=2),
            CUstreamBatchMemOpParams=_Params, CUdeviceptr=int, CUmemcpyAttributes=SimpleNamespace,
            CUmemcpySrcAccessOrder=ns(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM=1),
            cuMemcpyAsync=rec("copy"), cuMemcpyBatchAsync=rec("batch"), cuStreamBatchMemOp=rec("signals"),
            cuStreamWaitValue32=rec("wait"), cuStreamWriteValue32=rec("write"))
    return cu, calls


def _copies(calls):
    """The copy calls' (dsts, srcs, sizes), in order (signal calls' parameter objects left out)."""
    return [args[:3] for name, args in calls if name in ("copy", "batch")]


def _lowered(matrix, base, mode=StreamMode.BATCH):
    sched = plan_all_to_all(2, 0, matrix, algorithm=Algorithm.PULL, stream_mode=mode)
    return lower(sched, _address(base), _pads(2))


def _launch_all(program, cu):
    for k in range(len(program.slots)):
        program.launch_slot(k, "stream", 5)


def test_new_buffers_and_sizes_of_one_shape_readdress_to_a_fresh_compile():
    first = _lowered(((96, 160), (32, 64)), 1 << 36)
    second = _lowered(((200, 8), (48, 16)), 9 << 36)  # other sizes, other buffers, the same steps
    assert shape(first) == shape(second) and first != second
    cu, calls = _fake_cu()
    program = CompiledProgram(first, cu)
    _launch_all(program, cu)
    original = _copies(calls)
    calls.clear()
    other = program.readdressed(second, cu)
    _launch_all(other, cu)
    patched = _copies(calls)
    calls.clear()
    _launch_all(CompiledProgram(second, cu), cu)
    assert patched == _copies(calls) and patched  # the same copies as a fresh compile of the new lowering
    calls.clear()
    _launch_all(program, cu)
    assert _copies(calls) == original != patched  # the template still makes its own copies

    def signals(p):
        return [c for slot in p.slots for c in slot if not isinstance(c, cuda_program._READDRESSED_CALLS)]

    assert signals(other) == signals(program) and signals(program)  # shared, not rebuilt


def test_another_shape_is_told_apart():
    batch = _lowered(((96, 160), (32, 64)), 1 << 36)
    assert shape(batch) != shape(_lowered(((96, 160), (32, 64)), 1 << 36, StreamMode.PER_PEER))
    assert shape(batch) != shape(lower(plan_all_to_all(2, 1, ((96, 160), (32, 64)), algorithm=Algorithm.PULL,
                                                       stream_mode=StreamMode.BATCH), _address(1 << 36), _pads(2)))
