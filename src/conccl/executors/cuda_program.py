"""A Schedule compiled into the driver calls that run it, built once and replayed every call.

Launching a copy-engine collective is host work: at 1 MiB the GPU needs ~20 us, while one
Python driver call costs a few microseconds, and a 4-rank call used to make 17 of them (one per
signal and copy), each building its argument objects anew. Two things make it cheap:

* **lowering** (pure, tested on CPU): consecutive signal operations of a slot become one
  ``cuStreamBatchMemOp`` (waits and writes in order, as the separate calls ran), and the
  peer copies of a BATCH schedule one ``cuMemcpyBatchAsync``. A small own-shard copy joins
  that batch (:func:`hoist_small_local`). A 4-rank push all-gather of 1 MiB is then 3 driver
  calls instead of 16.
* **compiling** (CUDA): the lowered steps with every address resolved and every cuda-python
  argument object built, cached by the executor per (schedule, buffers). A call only writes
  its sequence number into the prebuilt signal parameters and makes the calls.

Lowered form of one slot: a tuple of steps, each one of

* ``("signals", ((is_wait, address, seq_delta), ...))``: one batch of stream memory ops;
  waits are "word >= seq + seq_delta" on the own pad, writes put ``seq + seq_delta`` into a
  peer's pad with a fence before it;
* ``("signal", (is_wait, address, seq_delta))``: one ``cuStreamWaitValue32`` or
  ``cuStreamWriteValue32``, where the driver does not take that op in a batch;
* ``("copy", (dst, src, nbytes))``: one ``cuMemcpyAsync``;
* ``("copies", ((dst, src, nbytes), ...))``: one ``cuMemcpyBatchAsync``;
* ``("reduce", (dst, (src, ...), nbytes, dtype, scale))``: one launch of the bounded
  reduction kernel (:mod:`conccl.executors.cuda_reduce`), the only SM work of any schedule.
"""
from __future__ import annotations

from typing import Callable

from .._driver import check, signal_flags
from ..schedule import Copy, Phase, Reduce, ResetSignal, Schedule, SetSignal, StreamMode, WaitSignal, signal_word
from .cuda_reduce import ReduceLaunch

# cuStreamBatchMemOp takes fewer than 256 operations per call.
MAX_SIGNALS_PER_BATCH = 255
# An own-shard copy up to this size rides in the peer-copy batch before it (see hoist_small_local).
HOIST_LOCAL_MAX_BYTES = 1 << 20


def _is_small_local(op) -> bool:
    return isinstance(op, Copy) and op.transfer.phase is Phase.LOCAL and op.transfer.nbytes <= HOIST_LOCAL_MAX_BYTES


def hoist_small_local(ops) -> list:
    """``ops`` with each small own-shard copy moved up next to the peer copies before it.

    Schedules put the own shard (a same-GPU copy) after the DONE signals, off the critical
    path. When it is small, the driver call it costs (~4 us of host time) is worth more than
    the GPU time it adds to the peer-copy batch (< 1 us at 1 MiB), so it joins that batch.
    Only signal *writes* are stepped over: the own shard touches only this rank's own memory,
    which no peer reads or writes, so moving it before them changes nothing but timing.
    """
    out = list(ops)
    joined = set()  # own copies now in the peer-copy batch: the next one may join behind them
    for i, op in enumerate(out):
        if not _is_small_local(op):
            continue
        j = i
        while j > 0 and isinstance(out[j - 1], SetSignal):
            j -= 1
        prev = out[j - 1] if j > 0 else None
        behind_batch = isinstance(prev, Copy) and (prev.transfer.src_rank != prev.transfer.dst_rank or id(prev) in joined)
        if behind_batch and (j < i or id(prev) in joined):
            out.insert(j, out.pop(i))
            joined.add(id(op))
    return out


def lower_slot(ops, address: Callable[[int, object], int], pads: list[int], rank: int, world: int,
               batch_copies: bool, batching: str = "all") -> tuple:
    """Lower one slot's ops to driver steps. ``address(rank, buf)`` is a buffer's base
    address as this rank reaches it; ``pads[r]`` the address of rank r's signal pad.
    ``batching``: which signal ops may share a ``cuStreamBatchMemOp`` ("all", "waits" or
    "none"; what the driver accepts is probed once per group, see :func:`probe_batching`)."""
    steps: list = []
    signals: list = []
    copies: list = []
    with_peers = False  # the copy batch under way holds peer copies
    if batch_copies:
        ops = hoist_small_local(ops)

    def flush_signals():
        for i in range(0, len(signals), MAX_SIGNALS_PER_BATCH):
            steps.append(("signals", tuple(signals[i:i + MAX_SIGNALS_PER_BATCH])))
        signals.clear()

    def flush_copies():
        nonlocal with_peers
        if copies:
            # own copies alone: a batch of one is a plain copy
            steps.append(("copy", copies[0]) if len(copies) == 1 and not with_peers else ("copies", tuple(copies)))
            copies.clear()
        with_peers = False

    for op in ops:
        if isinstance(op, Copy):
            flush_signals()
            t = op.transfer
            triple = (address(t.dst_rank, t.dst) + t.dst_offset, address(t.src_rank, t.src) + t.src_offset, t.nbytes)
            if not batch_copies:
                steps.append(("copy", triple))
                continue
            peer = t.src_rank != t.dst_rank
            # A peer copy does not join a batch of own copies; a large own copy does not join the
            # peer copies' batch (it would hold back what waits for that batch); a run of own
            # copies (a reduce-scatter from parts: one per parameter) is one batch of its own.
            if copies and (with_peers != peer) and (peer or not _is_small_local(op)):
                flush_copies()
            with_peers |= peer
            copies.append(triple)
            continue
        flush_copies()
        if isinstance(op, Reduce):
            flush_signals()
            steps.append(("reduce", (address(rank, op.dst[0]) + op.dst[1],
                                     tuple(address(rank, b) + off for b, off in op.srcs), op.nbytes, op.dtype, op.scale)))
            continue
        if isinstance(op, WaitSignal):
            entry = (True, pads[rank] + 4 * signal_word(op.kind, op.peer, world), op.seq_delta)
        elif isinstance(op, SetSignal):
            entry = (False, pads[op.peer] + 4 * signal_word(op.kind, rank, world), op.seq_delta)
        elif isinstance(op, ResetSignal):  # a captured call, launched as call 1: writes 1 - 1 = 0
            entry = (False, pads[rank] + 4 * signal_word(op.kind, op.peer, world), -1)
        else:
            raise TypeError(f"unknown schedule op {op!r}")
        if batching == "all" or (batching == "waits" and entry[0]):
            signals.append(entry)
        else:  # a batch of one: the plain cuStreamWaitValue32 / cuStreamWriteValue32
            flush_signals()
            steps.append(("signal", entry))
    flush_signals()
    flush_copies()
    return tuple(steps)


def lower(schedule: Schedule, address: Callable[[int, object], int], pads: list[int], batching: str = "all",
          batch_copies: bool | None = None) -> tuple:
    """Every slot of ``schedule`` lowered (see :func:`lower_slot`); ``batch_copies`` None: as
    its stream mode says (a captured call passes False: cuMemcpyBatchAsync cannot be captured)."""
    batch = schedule.stream_mode is StreamMode.BATCH if batch_copies is None else batch_copies
    return tuple(lower_slot(ops, address, pads, schedule.rank, schedule.world, batch, batching)
                 for ops in schedule.slots)


class CompiledProgram:
    """Lowered steps as prebuilt cuda-python objects; :meth:`launch` queues one call."""

    def __init__(self, lowered: tuple, cu, device_index: int | None = None):
        self.cu = cu
        wait_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
        write_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32
        geq, fenced = self._geq, self._fenced = signal_flags(cu)
        self.slots = []
        for steps in lowered:
            built = []
            for kind, payload in steps:
                if kind == "signals":
                    params, patches = [], []
                    for is_wait, addr, delta in payload:
                        p = cu.CUstreamBatchMemOpParams()
                        p.operation = wait_op if is_wait else write_op
                        sub = p.waitValue if is_wait else p.writeValue
                        sub.operation = p.operation
                        sub.address = cu.CUdeviceptr(addr)
                        sub.flags = geq if is_wait else fenced
                        params.append(p)
                        patches.append((sub, delta))
                    built.append((0, params, len(params), tuple(patches)))
                elif kind == "signal":
                    is_wait, addr, delta = payload
                    built.append((3, cu.CUdeviceptr(addr), delta, is_wait))
                elif kind == "copy":
                    dst, src, nbytes = payload
                    built.append((1, cu.CUdeviceptr(dst), cu.CUdeviceptr(src), nbytes))
                elif kind == "reduce":
                    built.append((4, ReduceLaunch(device_index, *payload), None, None))
                else:
                    attrs = cu.CUmemcpyAttributes()
                    attrs.srcAccessOrder = cu.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
                    dsts, srcs, sizes = (list(x) for x in zip(*payload))
                    built.append((2, ([cu.CUdeviceptr(d) for d in dsts], [cu.CUdeviceptr(s) for s in srcs], sizes,
                                      len(sizes), [attrs], [0], 1), None, None))
            self.slots.append(tuple(built))

    def launch_slot(self, k: int, stream, seq: int) -> None:
        """Queue slot ``k`` of call ``seq`` on ``stream`` (a ``CUstream``)."""
        cu = self.cu
        for i, (kind, a, b, c) in enumerate(self.slots[k]):
            if kind == 0:
                for sub, delta in c:
                    sub.value = (seq + delta) & 0xFFFFFFFF
                err = cu.cuStreamBatchMemOp(stream, b, a, 0)
            elif kind == 1:
                err = cu.cuMemcpyAsync(a, b, c, stream)
            elif kind == 4:
                err = a.launch(cu, stream)
            elif kind == 3:
                value = (seq + b) & 0xFFFFFFFF
                err = (cu.cuStreamWaitValue32(stream, a, value, self._geq) if c else
                       cu.cuStreamWriteValue32(stream, a, value, self._fenced))
            else:
                err = cu.cuMemcpyBatchAsync(*a, stream)
            if err[0]:
                self._fail(err, k, i)

    def _fail(self, err, k: int, i: int) -> None:
        kind, a, b, c = self.slots[k][i]
        what = {0: f"cuStreamBatchMemOp of {b} ops", 1: f"cuMemcpyAsync of {c} bytes", 2: "cuMemcpyBatchAsync",
                3: "cuStreamWaitValue32" if c else "cuStreamWriteValue32", 4: "the reduction kernel's launch"}[kind]
        try:
            check(err)
        except RuntimeError as e:
            raise RuntimeError(f"{e} in {what} (slot {k}, step {i} of {len(self.slots[k])})") from None


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
