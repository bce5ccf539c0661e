"""A Schedule compiled into the driver calls that run it, built once and replayed every call.

Launching a copy-engine collective is host work: at 1 MiB the GPU needs ~20 us, while one
Python driver call costs a few microseconds, and a 4-rank call used to make 17 of them (one per
signal and copy), each building its argument objects anew. Two things make it cheap:

* **lowering** (pure, tested on CPU): consecutive signal operations of a slot become one
  ``cuStreamBatchMemOp`` (waits and writes in order, as the separate calls ran), and the
  copies of a BATCH schedule one ``cuMemcpyBatchAsync``. A 4-rank push all-gather is then 8
  driver calls instead of 16.
* **compiling** (CUDA): the lowered steps with every address resolved and every cuda-python
  argument object built, cached by the executor per (schedule, buffers). A call only writes
  its sequence number into the prebuilt signal parameters and makes the calls.

Lowered form of one slot: a tuple of steps, each one of

* ``("signals", ((is_wait, address, seq_delta), ...))``: one batch of stream memory ops;
  waits are "word >= seq + seq_delta" on the own pad, writes put ``seq + seq_delta`` into a
  peer's pad with a fence before it;
* ``("copy", (dst, src, nbytes))``: one ``cuMemcpyAsync``;
* ``("copies", ((dst, src, nbytes), ...))``: one ``cuMemcpyBatchAsync``.
"""
from __future__ import annotations

from typing import Callable

from .._driver import check
from ..schedule import Copy, Schedule, SetSignal, StreamMode, WaitSignal, signal_word

# cuStreamBatchMemOp takes fewer than 256 operations per call.
MAX_SIGNALS_PER_BATCH = 255


def lower_slot(ops, address: Callable[[int, object], int], pads: list[int], rank: int, world: int,
               batch_copies: bool) -> tuple:
    """Lower one slot's ops to driver steps. ``address(rank, buf)`` is a buffer's base
    address as this rank reaches it; ``pads[r]`` the address of rank r's signal pad."""
    steps: list = []
    signals: list = []
    copies: list = []

    def flush_signals():
        for i in range(0, len(signals), MAX_SIGNALS_PER_BATCH):
            steps.append(("signals", tuple(signals[i:i + MAX_SIGNALS_PER_BATCH])))
        signals.clear()

    def flush_copies():
        if copies:
            steps.append(("copies", tuple(copies)))
            copies.clear()

    for op in ops:
        if isinstance(op, Copy):
            flush_signals()
            t = op.transfer
            triple = (address(t.dst_rank, t.dst) + t.dst_offset, address(t.src_rank, t.src) + t.src_offset, t.nbytes)
            if batch_copies and t.src_rank != t.dst_rank:
                copies.append(triple)
            else:
                flush_copies()
                steps.append(("copy", triple))
            continue
        flush_copies()
        if isinstance(op, WaitSignal):
            signals.append((True, pads[rank] + 4 * signal_word(op.kind, op.peer, world), op.seq_delta))
        elif isinstance(op, SetSignal):
            signals.append((False, pads[op.peer] + 4 * signal_word(op.kind, rank, world), op.seq_delta))
        else:
            raise TypeError(f"unknown schedule op {op!r}")
    flush_signals()
    flush_copies()
    return tuple(steps)


def lower(schedule: Schedule, address: Callable[[int, object], int], pads: list[int]) -> tuple:
    """Every slot of ``schedule`` lowered (see :func:`lower_slot`)."""
    batch = schedule.stream_mode is StreamMode.BATCH
    return tuple(lower_slot(ops, address, pads, schedule.rank, schedule.world, batch) for ops in schedule.slots)


class CompiledProgram:
    """Lowered steps as prebuilt cuda-python objects; :meth:`launch` queues one call."""

    def __init__(self, lowered: tuple, cu):
        self.cu = cu
        wait_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
        write_op = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32
        geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
        # The default write flags put a fence before the write: a peer that sees the signal
        # also sees every copy this stream issued before it. GEQ compares
        # (int32)(*addr - value) >= 0, so sequence numbers may wrap around.
        fenced = cu.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
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
                elif kind == "copy":
                    dst, src, nbytes = payload
                    built.append((1, cu.CUdeviceptr(dst), cu.CUdeviceptr(src), nbytes))
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
        for kind, a, b, c in self.slots[k]:
            if kind == 0:
                for sub, delta in c:
                    sub.value = (seq + delta) & 0xFFFFFFFF
                err = cu.cuStreamBatchMemOp(stream, b, a, 0)
            elif kind == 1:
                err = cu.cuMemcpyAsync(a, b, c, stream)
            else:
                err = cu.cuMemcpyBatchAsync(*a, stream)
            if err[0]:
                check(err)
