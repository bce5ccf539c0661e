"""CPU reference executor: runs any Schedule across processes over shared memory.

It follows the signal protocol of ``conccl.schedule.base`` word for word, with each rank's signal
pad, workspace and symmetric tensors in POSIX shared memory, so CI checks data placement and
synchronisation at any world size without a GPU. Slots are emulated as concurrent streams: a
slot runs until it reaches a wait that is not yet satisfied, then the next slot gets a turn.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import time

import numpy as np
import torch

from ..device import shm as _shm
from ..group.board import HostBoard
from ..errors import CollectiveTimeout
from ..collectives.reduce_scatter import reduce_chunks
from ..schedule.captured import GRAPH_SLOTS, GRAPH_VALUE, primed_free_words
from ..schedule.base import (AwaitMark, Buf, Compute, Copy, Mark, Reduce, ResetMark, ResetSignal, Schedule, SetSignal,
                        WaitSignal, mark_index, pad_words, signal_pad_words, signal_word, workspace_half)
from ..group.work import NCCL, Work
from .base import GrowingWorkspace


class _Deferred:
    """An ``async_op=True`` call on the reference executor, modelling a stream: it runs when
    waited on, or before any later call of the group runs (in call order), never at once. So a
    test sees what CUDA users see: not complete when returned, complete after ``wait()``."""

    def __init__(self, executor: "ReferenceExecutor", run):
        self._executor, self._run, self.done, self.error = executor, run, False, None

    def query(self) -> bool:
        return self.done

    def run_now(self) -> None:
        """Run every deferred call of the group up to this one, in order (stream semantics)."""
        self._executor.flush(until=self)
        if self.error is not None:
            raise self.error


def _reach(schedule: Schedule) -> dict:
    """How far from its start the schedule reaches into the own input and output, in bytes."""
    reach = {}
    for ops in schedule.slots:
        for op in ops:
            if isinstance(op, Copy):
                t = op.transfer
                ends = ((t.src, t.src_offset) if t.src_rank == schedule.rank else None,
                        (t.dst, t.dst_offset) if t.dst_rank == schedule.rank else None)
                for end in ends:
                    if end is not None:
                        reach[end[0]] = max(reach.get(end[0], 0), end[1] + t.nbytes)
            elif isinstance(op, Reduce):
                for (buf, off), n in ((op.dst, op.out_bytes), *((src, op.nbytes) for src in op.srcs)):
                    reach[buf] = max(reach.get(buf, 0), off + n)
    return reach


class ReferenceExecutor(GrowingWorkspace):
    device_type = "cpu"
    one_shot = True  # runs a one-shot schedule's ops one by one (conccl.collectives.one_shot)

    def __init__(self, prefix: str, rank: int, world: int, board: HostBoard, timeout_s: float):
        self.prefix, self.rank, self.world, self.board, self.timeout_s = prefix, rank, world, board, timeout_s
        self._mine: list = []  # shared-memory segments this rank created (and unlinks)
        self._attached: list = []  # peers' segments this rank maps
        # The eager words, then one block per graph slot (conccl.schedule.captured), then the marks, as on CUDA.
        words = pad_words(world, GRAPH_SLOTS)
        self._pad_shm = self._create(f"{prefix}_sig_r{rank}", words * 4)
        pad = np.ndarray(words, np.uint32, self._pad_shm.buf)
        pad[:] = 0
        pad[primed_free_words(world)] = GRAPH_VALUE  # as on CUDA (conccl.schedule.captured: staged pulls, workspace pushes)
        self._barrier()
        self._all_pads = [self._attach_words(f"{prefix}_sig_r{p}") for p in range(world)]
        # Every rank has mapped every pad before any goes on: a rank whose work needs no peer
        # (arguments refused before any call) could otherwise close, and unlink its pad, while
        # a slow peer was still to map it (seen once under load, tests/multiproc/test_tp_parallelize.py).
        self._barrier()
        self._pads = [pad[:signal_pad_words(world)] for pad in self._all_pads]
        # only this rank's streams use them: the eager calls' block (a captured call uses its slot's)
        self._marks = self._all_pads[rank][mark_index(0, world, GRAPH_SLOTS):mark_index(0, world, GRAPH_SLOTS, 0)]
        self._capture: list | None = None  # calls recorded by capture(), None when not capturing
        self._ws_gen, self._ws = 0, [None] * world
        self._allocs: list[tuple[int, int, str]] = []  # (start, end, name pattern) of symmetric tensors
        self._peer_allocs: dict[tuple[str, int], np.ndarray] = {}
        self._deferred: list[_Deferred] = []  # async calls not run yet, in call order
        self._ws_now = None  # a captured call's own workspace while it runs
        self._ws_half = 0  # byte offset of the running call's workspace half
        self._reach: dict = {}  # the running schedule's reach into the own input and output (_reach)

    # ------------------------------------------------------------ shared memory
    def _create(self, name, nbytes):
        shm = _shm.create(name, nbytes)
        self._mine.append(shm)
        return shm

    def _attach_words(self, name):
        return self._attach_bytes(name, pad_words(self.world, GRAPH_SLOTS) * 4).view(np.uint32)

    def _attach_bytes(self, name, nbytes=None):
        shm = _shm.attach(name)
        self._attached.append(shm)
        return np.ndarray(shm.size if nbytes is None else nbytes, np.uint8, shm.buf)

    def _barrier(self):
        self.board.exchange([], "conccl reference barrier", self.timeout_s)

    def empty(self, shape, dtype):
        """A CPU tensor in shared memory that peers can read and write (collective call)."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        k = len(self._allocs)
        pattern = f"{self.prefix}_t{k}_r{{rank}}"
        shm = self._create(pattern.format(rank=self.rank), nbytes)
        t = torch.frombuffer(shm.buf, dtype=torch.uint8, count=max(nbytes, 1))[:nbytes].view(dtype).view(shape)
        base = t.untyped_storage().data_ptr()  # not t.data_ptr(): 0 for an empty tensor
        self._allocs.append((base, base + nbytes, pattern))
        self._barrier()
        return t

    @property
    def views_generation(self) -> int:
        """Changes whenever what :meth:`peer_view` answers for some address may have changed."""
        return len(self._allocs)

    def peer_view(self, t):
        """(the name pattern of the shared-memory allocation holding ``t``, byte offset in it,
        the allocation's number: allocations are collective, numbered alike on every rank);
        None: peers cannot reach it."""
        # From the storage, not t.data_ptr(): an empty view's data_ptr() is 0.
        p = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
        for number, (start, end, pattern) in enumerate(self._allocs):
            if start <= p < end or (start == p == end):
                return pattern, p - start, number
        return None

    def _map_workspace(self, nbytes: int) -> None:
        # Every rank's previous calls completed (they run on the host), so no peer still reads
        # the old workspace.
        self._ws_gen += 1
        self._create(f"{self.prefix}_ws{self._ws_gen}_r{self.rank}", nbytes)
        self._barrier()
        self._ws = [self._attach_bytes(f"{self.prefix}_ws{self._ws_gen}_r{p}", nbytes) for p in range(self.world)]

    # ------------------------------------------------------------ graphs
    # A stand-in for CUDA graph capture, for the tests: calls made inside capture() are
    # recorded, not run, and replay() runs them again in order, as a graph replay would.
    @contextlib.contextmanager
    def capture(self):
        """Record the group's calls instead of running them; yields the list :meth:`replay` takes."""
        self.flush()
        self._capture = recorded = []
        try:
            yield recorded
        finally:
            self._capture = None

    def capturing(self) -> bool:
        return self._capture is not None

    def capture_call(self, schedule: Schedule, input, output, views, slot: int, timeout_s: float,
                     compute=None) -> None:
        """Record a captured call (graph slot ``slot``) with a workspace of its own (and a
        pipeline's ``compute``, run again at each replay)."""
        ws = None
        if schedule.workspace_bytes:
            name = f"{self.prefix}_gws{slot}_r{{rank}}"
            self._create(name.format(rank=self.rank), schedule.workspace_bytes)
            self._barrier()  # a collective call, as every capture is
            ws = [self._attach_bytes(name.format(rank=p), schedule.workspace_bytes) for p in range(self.world)]
        words = signal_pad_words(self.world)
        pads = [pad[(1 + slot) * words:(2 + slot) * words] for pad in self._all_pads]
        marks = self._all_pads[self.rank][mark_index(0, self.world, GRAPH_SLOTS, slot):
                                          mark_index(0, self.world, GRAPH_SLOTS, slot + 1)]
        self._capture.append((schedule, input, output, views, pads, ws, timeout_s, compute, marks))

    def replay(self, recorded: list) -> None:
        """Run captured calls once more, in order."""
        self.flush()
        for schedule, input, output, views, pads, ws, timeout_s, compute, marks in recorded:
            self._run_now(schedule, input, output, GRAPH_VALUE, timeout_s, views, pads=pads, ws=ws, compute=compute,
                          marks=marks)

    # ------------------------------------------------------------ execution
    def _bytes(self, rank: int, buf: Buf, input, output, views) -> np.ndarray:
        if buf is Buf.WORKSPACE:
            return self._ws_now[rank] if self._ws_now else self._ws[rank][self._ws_half:]
        t, view = (input, views[0]) if buf is Buf.INPUT else (output, views[1])
        if rank == self.rank:
            own = t.view(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
            reach = self._reach.get(buf, 0)
            if reach > own.size:
                # A parts call (conccl.group.parts, Schedule.parts) names its parts by offset from
                # the lowest one, as the CUDA executor takes them: address + offset. Only there:
                # any other schedule reaching past its tensor stays a numpy error in the tests.
                return np.ctypeslib.as_array((ctypes.c_uint8 * reach).from_address(t.data_ptr()))
            return own
        pattern, offsets = view
        key = (pattern, rank)
        if key not in self._peer_allocs:
            self._peer_allocs[key] = self._attach_bytes(pattern.format(rank=rank))  # peers' sizes may differ
        return self._peer_allocs[key][offsets[rank]:]

    def run(self, schedule: Schedule, input, output, seq: int, async_op: bool, timeout_s: float | None = None,
            flight=None, views=(None, None), compute=None) -> Work:
        """Run ``schedule`` as call ``seq``: now (after any deferred calls) when blocking; when
        ``async_op``, deferred until waited on or until a later call runs (see :class:`_Deferred`).
        ``compute(op)`` runs each :class:`~conccl.schedule.base.Compute` op of a pipeline."""
        if async_op:
            d = _Deferred(self, lambda: self._run_now(schedule, input, output, seq, timeout_s, views, compute=compute))
            self._deferred.append(d)
            return Work(event=d)
        self.flush()
        self._run_now(schedule, input, output, seq, timeout_s, views, compute=compute)
        return Work()

    def run_fallback(self, fn, async_op: bool, tensors) -> Work:
        """Run ``fn()`` (a torch.distributed call) in the group's order: after every deferred
        call, to completion (a CPU backend's work is waited for here); ``Work.path`` is "nccl"."""
        self.flush()
        work = fn()
        if work is not None:
            work.wait()
        return Work(path=NCCL)

    def flush(self, until: _Deferred | None = None) -> None:
        """Run the deferred calls in order (all of them, or up to and including ``until``)."""
        while self._deferred and (until is None or not until.done):
            d = self._deferred.pop(0)
            try:
                d._run()
            except BaseException as e:
                d.error = e
                raise
            finally:
                d.done = True

    def _reduce(self, op: Reduce, input, output, views) -> None:
        """``op`` as the CUDA kernel computes it: operands in order, fp32 accumulation, one rounding."""
        dtype = getattr(torch, op.dtype)

        def operand(rank, buf, offset):
            raw = self._bytes(rank, buf, input, output, views)[offset:offset + op.nbytes]
            return torch.from_numpy(raw.copy()).view(dtype)

        ranks = op.src_ranks or (self.rank,) * len(op.srcs)  # a one-shot's operands are the peers'
        result = reduce_chunks([operand(r, *src) for r, src in zip(ranks, op.srcs)], op.scale)
        result = result.to(getattr(torch, op.out_dtype or op.dtype))  # fp32 over 16-bit operands: no rounding
        dst = self._bytes(self.rank, op.dst[0], input, output, views)
        dst[op.dst[1]:op.dst[1] + op.out_bytes] = result.view(torch.uint8).numpy()

    def _run_now(self, schedule: Schedule, input, output, seq: int, timeout_s: float | None, views, pads=None,
                 ws=None, compute=None, marks=None) -> None:
        self._ws_now, self._reach = ws, _reach(schedule) if schedule.parts else {}
        # An eager double-buffered call's half (conccl.schedule.base); a captured call has its own region.
        self._ws_half = workspace_half(seq, self._ws_cap) if schedule.double_buffered and ws is None else 0
        if schedule.computes and compute is None:
            raise ValueError(f"a {schedule.collective} pipeline runs the caller's computation: pass compute=")
        try:
            self._run_schedule(schedule, input, output, seq, timeout_s, views, pads or self._pads, compute, marks)
        finally:
            self._ws_now, self._reach = None, {}

    def _run_schedule(self, schedule: Schedule, input, output, seq: int, timeout_s: float | None, views,
                      pads, compute=None, marks=None) -> None:
        """Run ``schedule`` to completion on the host.

        A wait unsatisfied for ``timeout_s`` raises :class:`CollectiveTimeout`; one waiting
        for a peer whose process exited, or after a peer aborted the group, raises at once.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        marks = self._marks if marks is None else marks
        pcs = [0] * schedule.num_slots
        start = time.monotonic()
        next_liveness = start + 0.1
        while True:
            progress = False
            for k, ops in enumerate(schedule.slots):
                while pcs[k] < len(ops):
                    op = ops[pcs[k]]
                    if isinstance(op, WaitSignal):
                        if pads[self.rank][signal_word(op.kind, op.peer, self.world)] < seq + op.seq_delta:
                            break
                    elif isinstance(op, SetSignal):
                        pads[op.peer][signal_word(op.kind, self.rank, self.world)] = seq + op.seq_delta
                    elif isinstance(op, ResetSignal):
                        pads[self.rank][signal_word(op.kind, op.peer, self.world)] = 0
                    elif isinstance(op, Copy):
                        t = op.transfer
                        src = self._bytes(t.src_rank, t.src, input, output, views)
                        dst = self._bytes(t.dst_rank, t.dst, input, output, views)
                        dst[t.dst_offset:t.dst_offset + t.nbytes] = src[t.src_offset:t.src_offset + t.nbytes]
                    elif isinstance(op, Reduce):
                        self._reduce(op, input, output, views)
                    elif isinstance(op, AwaitMark):
                        if marks[op.word] < seq:
                            break
                    elif isinstance(op, Mark):
                        marks[op.word] = seq
                    elif isinstance(op, ResetMark):
                        marks[op.word] = 0
                    elif isinstance(op, Compute):
                        if op.ws_offset is None:
                            compute(op)
                        else:  # a push pipeline's peer rows, in the call's workspace (half or region)
                            compute(op, torch.from_numpy(self._bytes(self.rank, Buf.WORKSPACE, input, output, views)))
                    pcs[k] += 1
                    progress = True
            if all(pc == len(ops) for pc, ops in zip(pcs, schedule.slots)):
                # Done, but a peer may have given up on this very call meanwhile (this rank was
                # too slow): its data cannot be trusted to be what the peer meant to send.
                broken = self.board.aborted()
                if broken is not None and broken.seq <= seq:
                    raise broken
                posted = self.board.posted_mismatch()  # this call ran on rows a peer did not have
                if posted is not None:
                    raise posted
                return
            if not progress:
                now = time.monotonic()
                blocked = lambda: sorted({ops[pc].peer for pc, ops in zip(pcs, schedule.slots) if pc < len(ops)})  # noqa: E731
                if now > next_liveness:  # what the CUDA executor's watchdog does, inline
                    next_liveness = now + 0.1
                    broken = self.board.aborted()
                    if broken is not None:
                        raise CollectiveTimeout(f"conccl {schedule.collective}", seq, blocked(), now - start,
                                                self.board.exited_peers(blocked()), note=str(broken))
                    posted = self.board.posted_mismatch()  # a call posted on rows a peer did not have
                    if posted is not None:
                        raise posted
                    gone = self.board.exited_peers(blocked())
                    if gone:
                        raise CollectiveTimeout(f"conccl {schedule.collective}", seq, blocked(), now - start, gone)
                if now - start > timeout_s:
                    raise CollectiveTimeout(f"conccl {schedule.collective}", seq, blocked(), now - start,
                                            self.board.exited_peers(blocked()))
                time.sleep(20e-6)

    def close(self) -> None:
        for shm in self._attached:
            try:
                shm.close()
            except BufferError:
                pass
        for shm in self._mine:
            try:
                shm.close()
            except BufferError:
                pass  # a tensor still views it; unlinking the name is what matters
            _shm.unlink(shm)

