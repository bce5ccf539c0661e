"""A lowered Schedule (:mod:`.lowering`) compiled into the driver calls that run it, built once
and replayed every call.

Launching a copy-engine collective is host work: at 1 MiB the GPU needs ~20 us, while one
Python driver call costs a few microseconds, and a 4-rank call used to make 17 of them (one per
signal and copy), each building its argument objects anew. Lowering batches the signals and
copies; compiling resolves every address and builds every cuda-python argument object once,
cached by the executor per (schedule, buffers). A call only writes its sequence number into the
prebuilt signal parameters and makes the calls: each compiled step is an object whose
``launch(stream, seq)`` makes its call with arguments built once.
"""
from __future__ import annotations

from ...device.driver import check, signal_flags
from ...kernels.reduce import ReduceLaunch
from .lowering import ComputeStep, CopyBatch, CopyStep, OneShotStep, ReduceStep, SignalBatch, SignalStep, SpinWaitStep

class CompiledProgram:
    """Lowered steps as prebuilt cuda-python calls; :meth:`launch_slot` queues one slot of a call."""

    def __init__(self, lowered: tuple, cu, device_index: int | None = None):
        flags = signal_flags(cu)
        self.slots = [tuple(_COMPILERS[type(step)](step, cu, flags, device_index) for step in steps)
                      for steps in lowered]

    def readdressed(self, lowered: tuple, cu, device_index: int | None = None) -> "CompiledProgram":
        """A program for ``lowered``, a lowering of this program's :func:`shape`: its copies and
        reductions built anew, its other calls (the signal batches, whose driver structures are
        most of a compile) shared with this program. Safe to share: a call writes its sequence
        number into them right before its driver call, and a group queues one call at a time."""
        program = CompiledProgram.__new__(CompiledProgram)
        program.slots = [tuple(_COMPILERS[type(step)](step, cu, None, device_index) if type(step) in _READDRESSED
                               else call for step, call in zip(steps, calls))
                         for steps, calls in zip(lowered, self.slots)]
        return program

    def launch_slot(self, k: int, stream, seq: int, compute=None) -> None:
        """Queue slot ``k`` of call ``seq`` on ``stream`` (a ``CUstream``); ``compute(op)``
        queues a pipeline's computation steps on that stream (the executor's)."""
        for i, call in enumerate(self.slots[k]):
            if call.__class__ is _ComputeCall:
                compute(call.op)
                continue
            err = call.launch(stream, seq)
            if err[0]:
                self._fail(err, k, i)

    def _fail(self, err, k: int, i: int) -> None:
        try:
            check(err)
        except RuntimeError as e:
            raise RuntimeError(f"{e} in {self.slots[k][i].what()} (slot {k}, step {i} of {len(self.slots[k])})") from None


# The compiled calls: each holds its driver function and its arguments, built once, and makes
# the call with the call's sequence number written in (cuda-python returns (CUresult, ...)).
class _SignalBatchCall:
    __slots__ = ("call", "params", "count", "patches")

    def __init__(self, step: SignalBatch, cu, flags: tuple, device_index):
        wait_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
        write_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32
        self.params, patches = [], []
        for signal in step.signals:
            p = cu.CUstreamBatchMemOpParams()
            p.operation = wait_op if signal.is_wait else write_op
            sub = p.waitValue if signal.is_wait else p.writeValue
            sub.operation = p.operation
            sub.address = cu.CUdeviceptr(signal.address)
            sub.flags = flags[0] if signal.is_wait else flags[1]
            self.params.append(p)
            patches.append((sub, signal.seq_delta))
        self.call, self.count, self.patches = cu.cuStreamBatchMemOp, len(self.params), tuple(patches)

    def launch(self, stream, seq: int):
        for sub, delta in self.patches:
            sub.value = (seq + delta) & 0xFFFFFFFF
        return self.call(stream, self.count, self.params, 0)

    def what(self) -> str:
        return f"cuStreamBatchMemOp of {self.count} ops"


class _SignalCall:
    __slots__ = ("call", "address", "seq_delta", "flags", "is_wait")

    def __init__(self, step: SignalStep, cu, flags: tuple, device_index):
        self.call = cu.cuStreamWaitValue32 if step.is_wait else cu.cuStreamWriteValue32
        self.address, self.seq_delta, self.is_wait = cu.CUdeviceptr(step.address), step.seq_delta, step.is_wait
        self.flags = flags[0] if step.is_wait else flags[1]

    def launch(self, stream, seq: int):
        return self.call(stream, self.address, (seq + self.seq_delta) & 0xFFFFFFFF, self.flags)

    def what(self) -> str:
        return "cuStreamWaitValue32" if self.is_wait else "cuStreamWriteValue32"


class _CopyCall:
    __slots__ = ("call", "dst", "src", "nbytes")

    def __init__(self, step: CopyStep, cu, flags: tuple, device_index):
        self.call, self.nbytes = cu.cuMemcpyAsync, step.nbytes
        self.dst, self.src = cu.CUdeviceptr(step.dst), cu.CUdeviceptr(step.src)

    def launch(self, stream, seq: int):
        return self.call(self.dst, self.src, self.nbytes, stream)

    def what(self) -> str:
        return f"cuMemcpyAsync of {self.nbytes} bytes"


class _CopyBatchCall:
    __slots__ = ("call", "args")

    def __init__(self, step: CopyBatch, cu, flags: tuple, device_index):
        attrs = cu.CUmemcpyAttributes()
        attrs.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        # dsts, srcs, sizes, count, one attribute set, the copies it applies to (from 0), how many sets
        self.call = cu.cuMemcpyBatchAsync
        self.args = ([cu.CUdeviceptr(c.dst) for c in step.copies], [cu.CUdeviceptr(c.src) for c in step.copies],
                     [c.nbytes for c in step.copies], len(step.copies), [attrs], [0], 1)

    def launch(self, stream, seq: int):
        return self.call(*self.args, stream)

    def what(self) -> str:
        return "cuMemcpyBatchAsync"


class _ReduceCall:
    __slots__ = ("cu", "kernel")

    def __init__(self, step: ReduceStep, cu, flags: tuple, device_index):
        self.cu, self.kernel = cu, ReduceLaunch(device_index, *step)

    def launch(self, stream, seq: int):
        return self.kernel.launch(self.cu, stream)

    def what(self) -> str:
        return "the reduction kernel's launch"


class _OneShotCall:
    __slots__ = ("cu", "kernel", "step")

    def __init__(self, step: OneShotStep, cu, flags: tuple, device_index):
        from ...kernels import one_shot

        args = one_shot.make_args(
            world=step.world, rank=step.rank, kind=step.kind, dtype=step.dtype, graph=step.graph,
            staged=step.staged, signal_to=step.signal_to, done_to=step.done_to, free_to=step.free_to,
            wait_signal=step.wait_signal, wait_done=step.wait_done, wait_free=step.wait_free, src_off=step.src_off,
            dst_off=step.dst_off, nbytes=step.nbytes, input=step.input, output=step.output,
            stage_bytes=step.stage_bytes, scale=step.scale, abort_word=step.abort_word,
            timed_out_word=step.timed_out_word,
            timeout_ns=UNBOUNDED_NS)
        self.cu, self.kernel, self.step = cu, one_shot.OneShotLaunch(device_index, args), step

    def launch(self, stream, seq: int):
        return self.kernel.launch(self.cu, stream, seq)

    def what(self) -> str:
        return "the one-shot kernel's launch"


class _SpinWaitCall:
    __slots__ = ("cu", "kernel", "count")

    def __init__(self, step: SpinWaitStep, cu, flags: tuple, device_index):
        from ...kernels import spin

        addresses, deltas = zip(*step.words)
        self.cu, self.count = cu, len(step.words)
        self.kernel = spin.SpinWaitLaunch(
            device_index, addresses, deltas, step.abort_word, step.abort_word + 4,
            UNBOUNDED_NS)

    def launch(self, stream, seq: int):
        return self.kernel.launch(self.cu, stream, seq)

    def what(self) -> str:
        return f"the spin-wait kernel's launch ({self.count} words)"


# A one-shot kernel, or a spin wait, waits as a stream memory operation does: until the peer
# signals or the group's watchdog, which reads the pad and names the missing peers, breaks the
# group and releases it (the abort word). A bound of its own would let a call whose peer is merely late
# end with garbage and no error.
UNBOUNDED_NS = 1 << 62


class _ComputeCall:
    __slots__ = ("op",)

    def __init__(self, step: ComputeStep, cu, flags: tuple, device_index):
        self.op = step.op

    def what(self) -> str:
        return f"the caller's computation step {self.op.index}"


_COMPILERS = {SignalBatch: _SignalBatchCall, SignalStep: _SignalCall, CopyStep: _CopyCall, CopyBatch: _CopyBatchCall,
              ReduceStep: _ReduceCall, ComputeStep: _ComputeCall, OneShotStep: _OneShotCall,
              SpinWaitStep: _SpinWaitCall}
# The steps a program re-addresses (CompiledProgram.readdressed): their calls are cheap to make
# (pointer lists, a kernel's parameters) and hold the buffers' addresses; the others (signals
# into the pads, the one-shot kernel's words) are compared whole by shape().
_READDRESSED = (CopyStep, CopyBatch, ReduceStep)
_READDRESSED_CALLS = tuple(_COMPILERS[t] for t in _READDRESSED)


BATCHING_MODES = ("all", "waits", "none")  # most batched first


def probe_batching(cu, stream, own_unused: int, peer_word: int) -> str | None:
    """Which signal ops this driver takes in a ``cuStreamBatchMemOp`` on ``stream``: "all",
    "waits" or "none" (only single ops); None if not even single stream memory ops.

    Tried once per group, before any call, on words no protocol step reads: a wait on the
    own pad's word for this rank itself (never written: nobody signals itself) and a write of
    0 into this rank's word of a peer's pad (still 0: this rank has not signalled yet).
    """
    wait_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
    write_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32

    def param(op, addr):
        p = cu.CUstreamBatchMemOpParams()
        p.operation = op
        sub = p.waitValue if op == wait_op else p.writeValue
        sub.operation, sub.address, sub.value = op, cu.CUdeviceptr(addr), 0
        return p

    for mode, params in (("all", [param(wait_op, own_unused), param(write_op, peer_word)]),
                         ("waits", [param(wait_op, own_unused), param(wait_op, own_unused)])):
        if not cu.cuStreamBatchMemOp(stream, len(params), params, 0)[0]:
            check(cu.cuStreamSynchronize(stream))
            return mode
    geq, fenced = signal_flags(cu)
    if (cu.cuStreamWaitValue32(stream, cu.CUdeviceptr(own_unused), 0, geq)[0]
            or cu.cuStreamWriteValue32(stream, cu.CUdeviceptr(peer_word), 0, fenced)[0]):
        return None
    check(cu.cuStreamSynchronize(stream))
    return "none"
