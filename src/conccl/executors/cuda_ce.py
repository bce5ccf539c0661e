"""CUDA copy-engine executor: runs a Schedule with no SM kernel at all.

Peer-reachable memory comes from PyTorch symmetric memory (CUDA backend). Each slot of the
schedule runs on its own stream from a pool, so transfers to different peers go to different
copy engines at once (the paper's one transfer per engine). Signals are
``cuStreamWriteValue32`` into a peer's pad and ``cuStreamWaitValue32`` on the own pad.

Streams of one call (PER_PEER, 4 ranks, rank 0, pull from staged inputs)::

    caller  ──work──●                                          ◆──later work
    slot 0           ╰─wait DONE(s-1) · stage in→ws · READY(s)→1,2,3 ─ join ─╯
    slot 1           ╰─wait READY(s) of 1 · ws@1 → out[1] · DONE(s)→1 ─╯
    slot 2           ╰─wait READY(s) of 2 · ws@2 → out[2] · DONE(s)→2 ─╯
    slot 3           ╰─wait READY(s) of 3 · ws@3 → out[3] · DONE(s)→3 ─╯
    slot 4           ╰─in → out[0] (own shard, same GPU, off the critical path) ─╯

Slot 0 also waits for the previous call's end, so calls on a group are ordered as on a NCCL
communicator even with ``async_op=True``, and a signal word is never written out of order.

Each call's start and end events go to the group's watchdog (``tracks_flights``). If a peer
never signals, the watchdog reads the own pad to name the peers still awaited
(:meth:`missing_peers`) and writes the awaited values into it itself (:meth:`release`), from a
stream of its own, so the stuck streams drain.
"""
from __future__ import annotations

import numpy as np
import torch

from .._driver import StreamOps
from ..communicator import workspace_capacity
from ..schedule import (Buf, Copy, Schedule, SetSignal, StreamMode, WaitSignal, awaited_peers, signal_pad_words,
                        signal_word)
from ..work import Work


class SymmetricRegistry:
    """Maps tensors allocated by :func:`conccl.empty` to their peers' addresses."""

    def __init__(self):
        self._by_storage: dict[int, tuple[int, object]] = {}  # storage ptr -> (nbytes, handle)

    def add(self, tensor, handle) -> None:
        storage = tensor.untyped_storage()
        self._by_storage[storage.data_ptr()] = (storage.nbytes(), handle)

    def lookup(self, tensor):
        """(handle, byte offset in the allocation) or None if not peer-reachable."""
        if tensor.device.type != "cuda":
            return None
        storage = tensor.untyped_storage()
        entry = self._by_storage.get(storage.data_ptr())
        if entry is None or entry[0] != storage.nbytes():
            return None
        return entry[1], tensor.data_ptr() - storage.data_ptr()


REGISTRY = SymmetricRegistry()


class CudaCopyEngineExecutor:
    device_type = "cuda"
    tracks_flights = True

    def __init__(self, group_name: str, rank: int, world: int, device: torch.device):
        from torch.distributed import _symmetric_memory as symm_mem

        self.symm_mem, self.group_name, self.rank, self.world, self.device = symm_mem, group_name, rank, world, device
        pad = symm_mem.empty(signal_pad_words(world), dtype=torch.int32, device=device)
        pad.zero_()  # set-up only; collectives never launch a kernel
        torch.cuda.synchronize(device)
        self._pad = pad
        self._pad_handle = symm_mem.rendezvous(pad, group_name)  # collective: peers zeroed theirs too
        self._pads = list(self._pad_handle.buffer_ptrs)
        self._streams = [torch.cuda.Stream(device) for _ in range(world + 1)]
        self._ops = [StreamOps(s.cuda_stream) for s in self._streams]
        self._join = [torch.cuda.Event() for _ in self._streams]
        self._start = torch.cuda.Event()
        self._last_end: torch.cuda.Event | None = None
        self._ws = None
        self._ws_handle = None
        self._ws_cap = 0
        self._spare_starts: list = []  # start events of finished calls (list append/pop are atomic)
        self._watch_stream = torch.cuda.Stream(device)  # the watchdog's: never behind a stuck wait
        self._watch_ops = StreamOps(self._watch_stream.cuda_stream)

    def is_symmetric(self, t) -> bool:
        return REGISTRY.lookup(t) is not None

    def ensure_workspace(self, nbytes: int) -> None:
        if nbytes <= self._ws_cap:
            return
        # Every rank comes here with the same nbytes (decided from the host board). Synchronising
        # first means this rank no longer reads any peer's old workspace; the rendezvous is a
        # barrier, so once it returns no peer reads ours and the old one can go.
        cap = workspace_capacity(nbytes)
        torch.cuda.synchronize(self.device)
        ws = self.symm_mem.empty(cap, dtype=torch.uint8, device=self.device)
        self._ws_handle = self.symm_mem.rendezvous(ws, self.group_name)
        self._ws, self._ws_cap = ws, cap

    def _address(self, rank: int, buf: Buf, input, output) -> int:
        if buf is Buf.WORKSPACE:
            return self._ws_handle.buffer_ptrs[rank]
        t = input if buf is Buf.INPUT else output
        if rank == self.rank:
            return t.data_ptr()
        handle, offset = REGISTRY.lookup(t)
        return handle.buffer_ptrs[rank] + offset

    def run(self, schedule: Schedule, input, output, seq: int, async_op: bool, timeout_s: float = 0.0,
            flight=None) -> Work:
        """Queue ``schedule`` (call ``seq``). ``flight``: fill in its start and end events for
        the watchdog (``timeout_s`` is the watchdog's business, not the GPU's)."""
        caller = torch.cuda.current_stream(self.device)
        streams, ops_of = self._streams, self._ops
        ctrl = streams[0]
        ctrl.wait_stream(caller)
        if self._last_end is not None:
            ctrl.wait_event(self._last_end)
        if flight is None:
            start = self._start
        else:  # a tracked call needs its own start event; finished ones come back through recycle
            start = self._spare_starts.pop() if self._spare_starts else torch.cuda.Event()
            flight.recycle = self._recycle
        start.record(ctrl)
        batch = schedule.stream_mode is StreamMode.BATCH
        own_pad = self._pads[self.rank]
        bases: dict = {}  # (rank, buffer) -> address, resolved once per call

        def address(rank, buf):
            key = (rank, buf)
            if key not in bases:
                bases[key] = self._address(rank, buf, input, output)
            return bases[key]

        for k, slot_ops in enumerate(schedule.slots):
            ops = ops_of[k]
            if k:
                streams[k].wait_event(start)
            pending: list[tuple[int, int, int]] = []
            for op in slot_ops:
                if isinstance(op, Copy):
                    t = op.transfer
                    dst = address(t.dst_rank, t.dst) + t.dst_offset
                    src = address(t.src_rank, t.src) + t.src_offset
                    if batch and t.src_rank != t.dst_rank:
                        pending.append((dst, src, t.nbytes))
                    else:
                        ops.memcpy(dst, src, t.nbytes)
                    continue
                if pending:
                    ops.memcpy_batch(*map(list, zip(*pending)))
                    pending = []
                if isinstance(op, WaitSignal):
                    ops.wait_value32(own_pad + 4 * signal_word(op.kind, op.peer, self.world), seq + op.seq_delta)
                elif isinstance(op, SetSignal):
                    ops.write_value32(self._pads[op.peer] + 4 * signal_word(op.kind, self.rank, self.world), seq + op.seq_delta)
            if pending:
                ops.memcpy_batch(*map(list, zip(*pending)))
            if k:
                self._join[k].record(streams[k])
                ctrl.wait_event(self._join[k])
        end = torch.cuda.Event()
        end.record(ctrl)
        self._last_end = end
        if flight is not None:
            flight.start, flight.end = start, end
        if async_op:
            # The caller's stream is not ordered after the copies yet: tell the caching
            # allocator the tensors are in use on ctrl until then.
            for t in (input, output):
                t.record_stream(ctrl)
            return Work(end, self.device, flight)
        caller.wait_event(end)
        return Work(None, flight=flight)

    # ------------------------------------------------------------------ watchdog side
    def _recycle(self, flight) -> None:
        # Re-recording an event does not affect waits already queued on it, and nothing but
        # the flight (now forgotten) refers to a start event.
        if len(self._spare_starts) < 1024:
            self._spare_starts.append(flight.start)

    def bind_thread(self) -> None:
        torch.cuda.set_device(self.device)

    def read_pad(self) -> np.ndarray:
        """The own signal pad as the GPU sees it now (a copy on the watchdog's stream)."""
        with torch.cuda.stream(self._watch_stream):  # a plain device-to-host copy, no kernel
            return self._pad.cpu().numpy().view(np.uint32)

    def missing_peers(self, schedule: Schedule, seq: int) -> list[int]:
        """Peers whose signal call ``seq`` of ``schedule`` still waits for."""
        return awaited_peers(schedule, seq, self.read_pad(), self.world)

    def release(self, seq: int) -> None:
        """Satisfy every stream wait queued for calls up to ``seq`` (the group is broken)."""
        own = self._pads[self.rank]
        for word in range(signal_pad_words(self.world)):
            self._watch_ops.write_value32(own + 4 * word, seq)
        self._watch_stream.synchronize()

    def close(self) -> None:
        self._ws = self._ws_handle = None

