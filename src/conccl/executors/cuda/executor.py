"""CUDA copy-engine executor: runs a Schedule with no SM kernel at all (but a reduction's sum,
and a one-shot schedule's single kernel: conccl.collectives.one_shot).

Peer-reachable memory comes from PyTorch symmetric memory (CUDA backend). Each slot of the
schedule runs on its own stream, so transfers to different peers can go to different copy
engines at once (the paper's one transfer per engine). Signals are ``cuStreamWriteValue32``
into a peer's pad and ``cuStreamWaitValue32`` on the own pad, batched where the driver allows
(:mod:`conccl.executors.cuda.program` compiles each schedule once into these calls).

Streams of one call (PER_PEER, 4 ranks, rank 0, pull from staged inputs)::

    caller  ──work──●                                          ◆──later work
    slot 0           ╰─stage in→ws[half s%2] · READY(s)→1,2,3 · release ─ join ─╯
    slot 1           ╰─wait READY(s) of 1 · ws@1 → out[1] · DONE(s)→1 ─╯
    slot 2           ╰─wait READY(s) of 2 · ws@2 → out[2] · DONE(s)→2 ─╯
    slot 3           ╰─wait READY(s) of 3 · ws@3 → out[3] · DONE(s)→3 ─╯
    slot 4           ╰─in → out[0] (own shard, same GPU, off the critical path) ─╯

Slot 0 runs on the caller's stream for a blocking call, on the group's stream for an async
one (or where the driver refuses an op on the legacy default stream). It waits for the
previous call's end whenever that ran on another stream, so calls on a group are ordered as
on a NCCL communicator and a signal word is never written out of order.

Each call's start and end events go to the group's watchdog (``tracks_flights``). If a peer
never signals, the watchdog reads the own pad to name the peers still awaited
(:meth:`missing_peers`) and writes the awaited values into it itself (:meth:`release`), from a
stream of its own, so the stuck streams drain.
"""
from __future__ import annotations

import dataclasses
import time
import warnings

import numpy as np
import torch
from torch.distributed import _symmetric_memory as symm_mem

from ... import env
from ...device.driver import StreamOps, check, driver
from ...errors import InvalidArgument
from ...schedule.captured import GRAPH_SLOTS, GRAPH_VALUE, mark_edges, mark_edges_on, primed_free_words
from ...schedule.base import (MARK_WORDS, Buf, Schedule, Signal, StreamMode, awaited_peers, mark_index, max_slots,
                        pad_words, signal_pad_words, signal_word, workspace_half)
from ...group.work import NCCL, Work
from . import graph_launch as settled_graphs
from ..base import GrowingWorkspace
from .program import BATCHING_MODES, CompiledProgram, lower, probe_batching, shape
from .settled_pipeline import Piece, queue_captured, settled_pipeline

# Calls between two refreshes of the eager mark words (:meth:`CudaCopyEngineExecutor._refresh_marks`):
# a mark is awaited with a 32-bit wrap-around comparison, so a word must never lag 2^31 calls.
MARK_REFRESH_CALLS = 1 << 30


def _word(value: int) -> int:
    """``value``'s low 32 bits as the int32 a pad word holds (what a stream memory operation
    writes of a sequence number; ``fill_`` of an int32 tensor refuses a value past 2^31 - 1)."""
    value &= 0xFFFFFFFF
    return value - ((value >> 31) << 32)

_MAX_PROGRAMS = 256  # compiled (schedule, buffers) pairs kept per group


def _addresses(own_rank: int, input, output, views, workspace):
    """``address(rank, buf)`` for lowering: a buffer's base as this rank reaches it (its own
    tensors directly, a peer's through the agreed views, every rank's workspace by its base)."""
    sym_in, sym_out = views

    def address(rank, buf):
        if buf is Buf.WORKSPACE:
            return workspace[rank]
        t, sym = (input, sym_in) if buf is Buf.INPUT else (output, sym_out)
        return t.data_ptr() if rank == own_rank else sym[0][rank] + sym[1][rank]

    return address


# The current stream's handle by device index, without building a Stream object (older
# builds lack the raw accessor).
_raw_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
               or (lambda device_index: torch.cuda.current_stream(device_index).cuda_stream))
_CURRENT: dict = {}  # (raw handle, device index) -> torch Stream


def current_stream(device_index: int):
    """The current stream of ``device_index``, found by its raw handle: ``torch.cuda.current_stream()``
    builds a new Stream object each time (2.6 us per call on H200 x4, scripts/host_floor.py).
    A handle names one stream while it lives; a reused handle is the same CUDA stream to every
    record and wait made on it (they go by handle)."""
    key = (_raw_stream(device_index), device_index)
    stream = _CURRENT.get(key)
    if stream is None:
        if len(_CURRENT) >= 64:
            _CURRENT.clear()
        stream = _CURRENT[key] = torch.cuda.current_stream(device_index)
    return stream


class SymmetricRegistry:
    """Maps tensors allocated by :func:`conccl.empty` to their peers' addresses."""

    def __init__(self):
        # storage ptr -> (nbytes, every rank's base address, handle kept alive, registration number)
        self._by_storage: dict[int, tuple[int, tuple[int, ...], object, int]] = {}
        self.generation = 0  # grows with every allocation: what lookup() answered may change

    def add(self, tensor, handle) -> None:
        storage = tensor.untyped_storage()
        self.generation += 1
        # Registrations follow rendezvous, a collective call: the n-th is the same allocation's
        # on every rank, which the group checks per call (its row's block fields).
        self._by_storage[storage.data_ptr()] = (storage.nbytes(), tuple(handle.buffer_ptrs), handle, self.generation)

    def remove(self, tensor) -> bool:
        """Forget ``tensor``'s allocation (False: it was not registered); its memory goes back
        once the caller drops the tensor, and calls stop taking it as peer-reachable."""
        storage = tensor.untyped_storage()
        entry = self._by_storage.get(storage.data_ptr())
        if entry is None or entry[0] != storage.nbytes():
            return False
        del self._by_storage[storage.data_ptr()]
        self.generation += 1
        return True

    def lookup(self, tensor):
        """(every rank's base address, byte offset in the allocation, registration number) or
        None if not peer-reachable.

        The offset comes from the storage offset, not ``data_ptr()``: an empty view's is 0."""
        if tensor.device.type != "cuda":
            return None
        storage = tensor.untyped_storage()
        entry = self._by_storage.get(storage.data_ptr())
        if entry is None or entry[0] != storage.nbytes():
            return None
        return entry[1], tensor.storage_offset() * tensor.element_size(), entry[3]



SPIN_WORDS = 2  # after the marks: a one-shot kernel's abort word (the watchdog's) and timeout flag


class _Program:
    """A compiled program cached for one (schedule, buffers): how many calls ran it, and its
    settled graph once it has one (None: not yet tried; False: cannot have one)."""

    __slots__ = ("schedule", "views", "ws", "program", "lowered", "uses", "graph", "pipelines")

    def __init__(self, schedule, views, ws, program, lowered):
        self.schedule, self.views, self.ws, self.program, self.lowered = schedule, views, ws, program, lowered
        self.uses, self.graph = 0, None
        # A pipeline's graphs, by the buffers its GEMM steps touch: [calls, graph or None/False],
        # the most recently used last (cuda_settled_pipeline)
        self.pipelines: dict = {}

    def close_graphs(self) -> None:
        """Destroy its graphs (a launch still queued runs: the driver frees it after)."""
        if self.graph:
            self.graph.close()
        for _, graph in self.pipelines.values():
            if graph:
                graph.close()
        self.pipelines.clear()


class CudaCopyEngineExecutor(GrowingWorkspace):
    device_type = "cuda"
    tracks_flights = True
    one_shot = True  # runs one-shot schedules as one kernel (conccl.collectives.one_shot)

    def __init__(self, group_name: str, rank: int, world: int, device: torch.device):
        # Whether a captured reduction's signals are awaited by the spin-wait kernel
        # (conccl.kernels.spin) instead of stream waits; each rank's own: the words and values
        # are the stream waits'. CONCCL_DISABLE=spin_waits turns it off.
        self.spin_waits = not env.disabled("spin_waits")
        self.symm_mem, self.group_name, self.rank, self.world, self.device = symm_mem, group_name, rank, world, device
        self.symmetric = SymmetricRegistry()  # this group's conccl.empty tensors
        # The eager words, then one block per graph slot (conccl.schedule.captured), then the pipelines' marks
        # (the eager calls' block, a block per graph slot), then the spin words of one-shot and
        # spin-wait kernels (the watchdog's abort, the kernel's timeout flag).
        spin = pad_words(world, GRAPH_SLOTS)
        pad = symm_mem.empty(spin + SPIN_WORDS, dtype=torch.int32, device=device)
        pad.zero_()  # set-up only: a copy-engine collective launches no kernel
        pad[torch.tensor(primed_free_words(world), device=device)] = GRAPH_VALUE  # conccl.schedule.captured: staged pulls, workspace pushes
        torch.cuda.synchronize(device)
        self._pad = pad
        self._pad_handle = symm_mem.rendezvous(pad, group_name)  # collective: peers zeroed theirs too
        self._pads = list(self._pad_handle.buffer_ptrs)
        self._marks = self._pads[rank] + 4 * mark_index(0, world, GRAPH_SLOTS)
        self._spin_index = spin
        self._spin_words = self._pads[rank] + 4 * spin
        self._device_index = device.index if device.index is not None else torch.cuda.current_device()
        self._streams = [torch.cuda.Stream(device) for _ in range(max_slots(world))]  # one per slot
        self._cu_streams: dict[int, object] = {}  # stream handle -> CUstream
        self._cu_streams_pool = [self._cu_stream(st) for st in self._streams]
        self._join = [torch.cuda.Event() for _ in self._streams]
        self._start = torch.cuda.Event()
        self._caller_mark = torch.cuda.Event()
        self._end_mark = torch.cuda.Event()
        self._last_end: torch.cuda.Event | None = None
        self._last_stream = None
        self._ws = None
        self._ws_handle = None
        self._ws_keys = (None, None)
        self._programs: dict = {}
        # Settled calls' programs launched as graphs (conccl.executors.cuda.graph_launch): made
        # so far, launches so far, programs that could not be captured; the capture's stream.
        self.programs_graphed = self.graph_launches = self.graph_failures = 0
        self.pipelines_graphed = 0  # of programs_graphed: conccl.tp pipelines (_settled_pipeline)
        # their memory pool and capture streams (cuda_settled_pipeline.TorchCapture); off for
        # good after a failed capture
        self._pipeline_pool = self._pipeline_streams = None
        self._pipeline_graphs_off = False
        self._capture_stream: int | None = None  # a raw stream of its own (cuda_graph_launch.create_stream)
        # Programs compiled for eager and persistent calls since start (not captured ones): a
        # loop whose buffers move compiles on every call.
        self.programs_compiled = 0
        self.program_compile_s = 0.0  # host seconds spent compiling or re-addressing them
        # The first program compiled of each shape (cuda_program.shape): a miss whose lowering
        # has a known shape builds its program from it, sharing its signal calls, instead of
        # compiling (programs_readdressed). Shapes are few (a collective's steps and signal
        # words per stream mode and flags; a one-shot call's hold its addresses too).
        self._by_shape: dict = {}
        self.programs_readdressed = 0
        self._graph_ws = self._graph_ws_handle = None  # reserve_graph_workspace()'s arena
        self._graph_ws_cap = self._graph_ws_used = 0
        self._graph_keep: list = []  # what captured calls refer to (programs, events)
        self.edge_captures = 0  # captured pipelines whose marks are graph edges (_capture_with_edges)
        self._graph_slots_used = 0  # graph slots captured calls hold (their words released on failure)
        self._spare_events: list = []  # events of finished calls (list append/pop are atomic)
        self.mark_refresh_calls, self._marks_written = MARK_REFRESH_CALLS, 0  # (_refresh_marks)
        self._watch_stream = torch.cuda.Stream(device)  # the watchdog's: never behind a stuck wait
        self._watch_ops = StreamOps(self._watch_stream.cuda_stream)
        # What the driver takes in one cuStreamBatchMemOp, on our streams and on the legacy
        # default stream (handle 0), where blocking calls from the default stream would run.
        own_unused = self._pads[rank] + 4 * signal_word(Signal.READY, rank, world)  # nobody signals itself
        peer_word = self._pads[(rank + 1) % world] + 4 * signal_word(Signal.READY, rank, world)
        cu = driver()
        on_pool = probe_batching(cu, self._cu_streams_pool[0], own_unused, peer_word)
        on_default = probe_batching(cu, cu.CUstream(0), own_unused, peer_word)
        if on_pool is None:
            raise RuntimeError("this GPU or driver does not run stream memory operations (cuStreamWaitValue32), "
                               "which conccl's copy-engine collectives need; use NCCL")
        self.batching = max(on_pool, on_default or on_pool, key=BATCHING_MODES.index)
        self._default_stream_ok = on_default is not None

    @property
    def views_generation(self) -> int:
        """Changes whenever what :meth:`peer_view` answers for some address may have changed."""
        return self.symmetric.generation

    def peer_view(self, t):
        """How peers reach ``t`` (every rank's base address, byte offset), None if they cannot;
        looked up once per call by the communicator and handed back to :meth:`run`."""
        return self.symmetric.lookup(t)

    def _map_workspace(self, nbytes: int) -> None:
        # Synchronising first means this rank no longer reads any peer's old workspace; the
        # rendezvous is a barrier, so once it returns no peer reads ours and the old one can go.
        torch.cuda.synchronize(self.device)
        ws = self.symm_mem.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._ws_handle = self.symm_mem.rendezvous(ws, self.group_name)
        self._ws = ws
        # Every rank's workspace as a call of each parity reaches it: a double-buffered call uses
        # half seq % 2 (conccl.schedule.base), a whole one the base (the even entry).
        self._ws_keys = tuple(tuple(p + workspace_half(parity, nbytes) for p in self._ws_handle.buffer_ptrs)
                              for parity in (0, 1))

    def _program(self, schedule: Schedule, input, output, views, seq: int) -> _Program:
        """``schedule`` compiled against these buffers (cached: loops reuse their tensors).

        Keyed by the identity of ``schedule`` and ``views``, which the communicator keeps while
        a call's arguments and its peers' do not change (hashing the views' addresses would
        cost more than the lookup saves); the hit is checked against the objects themselves,
        as an id can name a collected object, and against the current workspace. A
        double-buffered call alternates between two programs, one per workspace half."""
        parity = seq & 1 if schedule.double_buffered else 0
        ws = self._ws_keys[parity]  # every rank's workspace address (None before the first staging)
        key = (id(schedule), id(views), input.data_ptr(), output.data_ptr(), parity)
        hit = self._programs.get(key)
        if hit is not None and hit.schedule is schedule and hit.views is views and hit.ws is ws:
            return hit
        t0 = time.perf_counter()
        address = _addresses(self.rank, input, output, views, ws)
        lowered = lower(schedule, address, self._pads, self.batching, marks=self._marks, spin_words=self._spin_words,
                        spin=False)
        form = shape(lowered)
        template = self._by_shape.get(form)
        if template is not None:
            # A program of this shape exists (other buffers, other sizes: an FSDP step's new
            # parameters, a MoE layer's new routing): a new one shares its signal calls.
            program = template.readdressed(lowered, driver(), self._device_index)
            self.programs_readdressed += 1
        else:
            if len(self._by_shape) >= _MAX_PROGRAMS:  # a one-shot call's shape holds its buffers' addresses
                self._by_shape.clear()
            program = self._by_shape[form] = CompiledProgram(lowered, driver(), self._device_index)
            self.programs_compiled += 1
        self.program_compile_s += time.perf_counter() - t0
        if len(self._programs) >= _MAX_PROGRAMS:
            self._drop_programs()
        if hit is not None:  # a stale entry under this key (other views, workspace)
            hit.close_graphs()
        entry = self._programs[key] = _Program(schedule, views, ws, program, lowered)
        return entry

    def _drop_programs(self) -> None:
        for entry in self._programs.values():
            entry.close_graphs()
        self._programs.clear()

    def _settled_graph(self, entry: _Program, input, output, views):
        """``entry``'s graph (conccl.executors.cuda.graph_launch) once this is its GRAPH_AFTER-th
        call, made now; None before; False where it cannot have one (the calls stay driver calls)."""
        entry.uses += 1
        if entry.uses < settled_graphs.GRAPH_AFTER:
            return None
        entry.graph = False
        if not (settled_graphs.available() and settled_graphs.graphable(entry.lowered)):
            return False
        if not settled_graphs.peer_reachable(views, input, output, self.rank):
            return False  # a graph may replay a copy of PyTorch's memory as an SM kernel
        schedule = entry.schedule
        t0 = time.perf_counter()
        try:
            # The same signals; the copies one cuMemcpyAsync each (a batch cannot be captured).
            steps = lower(schedule, _addresses(self.rank, input, output, views, entry.ws), self._pads,
                          self.batching, batch_copies=False, marks=self._marks, spin_words=self._spin_words)
            if self._capture_stream is None:
                # Its own stream: one of PyTorch's pooled streams may be another group's or a
                # thread's, whose work would be captured into the graph.
                self._capture_stream = settled_graphs.create_stream()
            entry.graph = settled_graphs.SettledGraph(CompiledProgram(steps, driver(), self._device_index), steps[0],
                                                      self._capture_stream, driver())
            self.programs_graphed += 1
        except Exception as e:  # noqa: BLE001 - any failure here leaves the driver calls, which work
            self.graph_failures += 1
            if self.graph_failures == 1:
                warnings.warn(f"conccl: a settled {entry.schedule.collective} could not be launched as a graph ({e}); "
                              "its calls stay driver calls", stacklevel=3)
        self.program_compile_s += time.perf_counter() - t0
        return entry.graph

    def _settled_pipeline(self, entry: _Program, buffers: tuple, make_compute, input, output, views):
        """A settled pipeline's graph (:func:`conccl.executors.cuda.settled_pipeline.settled_pipeline`)."""
        return settled_pipeline(self, entry, buffers, make_compute, lambda: _addresses(self.rank, input, output,
                                                                                      views, entry.ws))

    def _current_stream(self):
        """The caller's current stream (:func:`current_stream`)."""
        return current_stream(self._device_index)

    def _cu_stream(self, stream) -> object:
        handle = stream.cuda_stream
        cu_stream = self._cu_streams.get(handle)
        if cu_stream is None:
            cu_stream = self._cu_streams[handle] = driver().CUstream(handle)
        return cu_stream

    def run(self, schedule: Schedule, input, output, seq: int, async_op: bool, timeout_s: float = 0.0,
            flight=None, views=(None, None), compute=None) -> Work:
        """Queue ``schedule`` (call ``seq``). ``flight``: fill in its start and end events for
        the watchdog (``timeout_s`` is the watchdog's business, not the GPU's). ``views``: for
        input and output, (every rank's base address, every rank's byte offset) as the
        communicator agreed them from :meth:`peer_view`, or None. ``compute(op)``: a
        pipeline's GEMM steps, called with the slot's stream current.

        A blocking call (``async_op=False``) runs its first slot on the caller's stream itself:
        ordered after the caller's work and before its later work with no event at all.
        """
        caller = self._current_stream()
        entry = self._program(schedule, input, output, views, seq)
        program = entry.program
        buffers = getattr(compute, "buffers", None)  # what a pipeline's GEMM steps touch (conccl.tp)
        steps = compute  # a pipeline's GEMM steps as the caller gave them (wrapped where they run)
        # cuMemcpyBatchAsync refuses the legacy default stream (handle 0).
        ctrl = self._control_stream(caller, async_op or (caller.cuda_stream == 0 and (
            schedule.stream_mode is StreamMode.BATCH or not self._default_stream_ok)))
        if seq - self._marks_written >= self.mark_refresh_calls:  # once per 2^30 calls
            self._refresh_marks(ctrl, seq)
        graph = entry.graph if compute is None else None
        if buffers is not None and not async_op:
            # on any stream: the graph's launch takes the legacy default stream (handle 0) as
            # PyTorch does (cuda_graph_launch.driver_functions), where a blocking call runs
            graph = self._settled_pipeline(entry, buffers, lambda: self._with_workspace(
                steps, self._ws_region(schedule, seq)), input, output, views)
        elif compute is None and graph is None and ctrl.cuda_stream:
            # not on the legacy default stream (handle 0), which cuda-python may take per thread
            graph = self._settled_graph(entry, input, output, views)
        graph = graph if graph and (ctrl.cuda_stream or compute is not None) else None
        # a pipeline's graph holds every slot: no fork to record (a flat graph has one slot)
        slots = () if graph is not None and compute is not None else range(1, len(program.slots))
        start = None
        if flight is not None:  # a tracked call needs its own events; finished ones come back
            start = self._spare_events.pop() if self._spare_events else torch.cuda.Event()
            flight.recycle = self._recycle_start if async_op else self._recycle_both
        elif slots:
            start = self._start
        if start is not None:
            start.record(ctrl)
        if graph is not None:
            graph.launch(ctrl.cuda_stream, seq)
            self.graph_launches += 1
        else:
            if compute is not None:  # the call's workspace region for a step reading it (push)
                compute = self._with_workspace(compute, self._ws_region(schedule, seq))
            program.launch_slot(0, self._cu_stream(ctrl), seq, compute and self._on(ctrl, compute))
        for k in slots:
            stream = self._streams[k]
            stream.wait_event(start)
            program.launch_slot(k, self._cu_streams_pool[k], seq, compute and self._on(stream, compute))
            self._join[k].record(stream)
            ctrl.wait_event(self._join[k])
        if async_op:
            end = torch.cuda.Event()  # the handle keeps it: never reused
        elif flight is not None:
            end = self._spare_events.pop() if self._spare_events else torch.cuda.Event()
        else:
            # Only the next call's wait needs it, and that is queued before it is recorded again.
            end = self._end_mark
        end.record(ctrl)
        self._last_end, self._last_stream = end, ctrl.cuda_stream
        if flight is not None:
            flight.start, flight.end = start, end
        if async_op:
            # The caller's stream is not ordered after the copies yet: tell the caching
            # allocator the tensors are in use on ctrl until then.
            for t in (input, output):
                t.record_stream(ctrl)
            return Work(end, self.device, flight)
        if ctrl is not caller:
            caller.wait_event(end)
        return Work(None, flight=flight)

    def _refresh_marks(self, ctrl, seq: int) -> None:
        """Write ``seq - 1`` into every eager mark word, on ``ctrl`` before call ``seq``'s slots
        fork from it (and after the group's previous call, which ``ctrl`` already follows). A
        mark is awaited with a 32-bit wrap-around comparison (``>= seq``), and some words go
        unwritten for long: a settled pipeline's graph turns its marks into graph edges and
        never writes them, a rarely used schedule's last steps' words wait for its next call.
        A word 2^31 calls stale would read as ahead and let a GEMM step or a piece go early;
        refreshed every ``mark_refresh_calls`` calls, none lags that far. ``seq - 1`` holds
        every await of this call and later ones until their writers write, and satisfies any
        of a finished call. A fill kernel: once per 2^30 calls by default. Not the graph
        slots' blocks (a captured replay's words, reset by the replay itself)."""
        lo = mark_index(0, self.world, GRAPH_SLOTS)
        with torch.cuda.stream(ctrl):
            self._pad[lo:lo + MARK_WORDS].fill_(_word(seq - 1))
        self._marks_written = seq

    def _ws_region(self, schedule: Schedule, seq: int):
        """This rank's workspace as eager call ``seq`` of ``schedule`` uses it (uint8): its half
        where double-buffered (:func:`~conccl.schedule.base.workspace_half`), else the whole."""
        ws = getattr(self, "_ws", None)
        if ws is None or not schedule.workspace_bytes:
            return None
        return ws[workspace_half(seq, ws.numel()):] if schedule.double_buffered else ws

    @staticmethod
    def _with_workspace(compute, workspace):
        """``compute`` as the program calls it, ``compute(op)``: a step reading the workspace (a
        push pipeline's peer rows, ``Compute.ws_offset``) gets the call's region too."""
        def call(op):
            if op.ws_offset is None:
                return compute(op)
            return compute(op, workspace)
        return call

    def _on(self, stream, compute):
        """``compute`` called with ``stream`` current (a pipeline's GEMM steps on their slot's).
        Where ``stream``'s device is current (the usual case), swapped in and out by
        ``torch.cuda.set_stream``: ``torch.cuda.stream()``'s context looks the device up and
        builds Stream objects, ~30 us of host time per step under a profiler (two per
        conccl.tp call); otherwise by that context."""
        index = self._device_index

        def run(op):
            if torch.cuda.current_device() != index:
                with torch.cuda.stream(stream):
                    return compute(op)
            prev = torch._C._cuda_getCurrentStream(index)  # (stream id, device, type): restored exactly
            torch.cuda.set_stream(stream)
            try:
                return compute(op)
            finally:
                torch._C._cuda_setStream(stream_id=prev[0], device_index=prev[1], device_type=prev[2])
        return run

    def _control_stream(self, caller, on_group_stream: bool):
        """The stream a call's first slot runs on: the caller's, or the group's (ordered after
        the caller's work); in either case after the group's previous call, since calls of a
        group run in order on the GPU (signal words only grow)."""
        if on_group_stream:
            ctrl = self._streams[0]
            self._caller_mark.record(caller)
            ctrl.wait_event(self._caller_mark)
        else:
            ctrl = caller
        if self._last_end is not None and self._last_stream != ctrl.cuda_stream:
            ctrl.wait_event(self._last_end)
        return ctrl

    def run_fallback(self, fn, async_op: bool, tensors) -> Work:
        """Run ``fn()`` (a torch.distributed call, e.g. NCCL's) in this group's order: after
        the group's previous call and before its next, on the stream a call of ours would take
        (the caller's, or the group's for an async call); ``Work.path`` is "nccl"."""
        ctrl = self._control_stream(self._current_stream(), async_op)
        if async_op:  # on the group's stream, which then waits for the backend's (the host does not)
            with torch.cuda.stream(ctrl):
                work = fn()
                if work is not None:
                    work.wait()
        else:  # the caller's stream is current, and a blocking torch.distributed call orders it
            fn()
        end = torch.cuda.Event() if async_op else self._end_mark
        end.record(ctrl)
        self._last_end, self._last_stream = end, ctrl.cuda_stream
        if not async_op:
            return Work(None, path=NCCL)
        for t in tensors:  # in use on ctrl until the caller waits
            t.record_stream(ctrl)
        return Work(end, self.device, path=NCCL)

    # ------------------------------------------------------------------ graphs
    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def reserve_graph_workspace(self, nbytes: int) -> None:
        """Symmetric memory for the workspaces of calls captured later (a collective call, made
        before capture: memory cannot be mapped with the peers while a stream is captured)."""
        if nbytes <= self._graph_ws_cap - self._graph_ws_used:
            return
        if self._graph_ws_used:
            raise InvalidArgument("the graph workspace is in use by captured calls and cannot grow; reserve what every "
                                  "graph needs before the first capture")
        torch.cuda.synchronize(self.device)
        ws = self.symm_mem.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._graph_ws_handle = self.symm_mem.rendezvous(ws, self.group_name)
        self._graph_ws, self._graph_ws_cap = ws, nbytes

    def capture_call(self, schedule: Schedule, input, output, views, slot: int, timeout_s: float,
                     compute=None) -> None:
        """Queue a captured call (graph slot ``slot``) on the capturing stream: its own signal
        words, its own workspace region, one cuMemcpyAsync per copy; a pipeline's GEMM steps
        (``compute(op)``, :meth:`run`'s) captured on its slot's stream, its marks as graph
        edges (:meth:`_capture_with_edges`; ``compute`` is then called in the order the
        segments are queued, not slot by slot)."""
        ws_base = None
        if schedule.workspace_bytes:
            need = -(-schedule.workspace_bytes // 256) * 256
            if self._graph_ws_used + need > self._graph_ws_cap:
                raise InvalidArgument(
                    f"a captured conccl {schedule.collective} needs {schedule.workspace_bytes} bytes of graph workspace "
                    f"and {self._graph_ws_cap - self._graph_ws_used} are left: call "
                    "conccl.reserve_graph_workspace(nbytes) with what every captured call needs before capturing "
                    "(tensors from conccl.empty need none for all-gather and all-to-all, unless CONCCL_ONE_SHOT_BELOW "
                    "makes the call one-shot: it stages its input, or an all-gather asks for Algorithm.STAGED_PUSH: "
                    "its output's bytes; an all-reduce in one pass takes world x its bytes)")
            ws_base = [p + self._graph_ws_used for p in self._graph_ws_handle.buffer_ptrs]
            if compute is not None:  # a push pipeline's GEMM steps read the call's own region
                compute = self._with_workspace(compute, self._graph_ws[self._graph_ws_used:self._graph_ws_used + need])
            self._graph_ws_used += need
        address = _addresses(self.rank, input, output, views, ws_base)
        words = 4 * signal_pad_words(self.world) * (1 + slot)
        pads = [p + words for p in self._pads]

        def compiled(s: Schedule) -> CompiledProgram:
            # Stream memory ops, batched or single, copies and the reduction kernel are captured
            # (scripts/graph_memops_probe.py on H200); cuMemcpyBatchAsync is not.
            return CompiledProgram(lower(s, address, pads, self.batching, batch_copies=False,
                                         marks=self._pads[self.rank] + 4 * mark_index(0, self.world, GRAPH_SLOTS, slot),
                                         spin_words=self._spin_words, spin=self.spin_waits), driver(),
                                   self._device_index)

        if schedule.computes and mark_edges_on():
            self._capture_with_edges(schedule, compiled, compute)
            self._graph_slots_used = max(self._graph_slots_used, slot + 1)
            return
        program = compiled(schedule)
        caller = torch.cuda.current_stream(self.device)
        events = [torch.cuda.Event() for _ in range(len(program.slots))]
        if len(program.slots) > 1:
            events[0].record(caller)
        program.launch_slot(0, self._cu_stream(caller), GRAPH_VALUE, compute and self._on(caller, compute))
        for k in range(1, len(program.slots)):  # a fork and join the capture follows
            stream = self._streams[k]
            stream.wait_event(events[0])
            program.launch_slot(k, self._cu_streams_pool[k], GRAPH_VALUE, compute and self._on(stream, compute))
            events[k].record(stream)
            caller.wait_event(events[k])
        self._graph_keep.append((program, events))
        self._graph_slots_used = max(self._graph_slots_used, slot + 1)

    def _capture_with_edges(self, schedule: Schedule, compiled, compute) -> None:
        """Capture a pipeline with its marks as graph edges (:func:`conccl.schedule.captured.mark_edges`):
        each segment compiled alone and queued in the order given, on its slot's stream (slot 0:
        the caller's; the others forked from it and joined back), an event recorded after a
        segment for each mark it writes and waited on before each segment awaiting it
        (:func:`~conccl.executors.cuda.settled_pipeline.queue_captured`, as a settled pipeline's)."""
        pieces = [Piece(seg.slot, seg.waits, seg.records, compiled(dataclasses.replace(schedule, slots=(seg.ops,))),
                        0, ()) for seg in mark_edges(schedule)]
        caller = torch.cuda.current_stream(self.device)
        events = queue_captured(pieces, caller, self._cu_stream(caller),
                                lambda k: (self._streams[k], self._cu_streams_pool[k]), GRAPH_VALUE,
                                lambda stream: compute and self._on(stream, compute))
        self._graph_keep.append(([piece.program for piece in pieces], events))
        self.edge_captures += 1

    # ------------------------------------------------------------------ watchdog side
    # Re-recording an event does not affect waits already queued on it, and the watchdog
    # hands back only finished, forgotten flights. Nothing else refers to their start event,
    # nor to the end event of a blocking call (its handle holds none; its late verdict is
    # then no longer checked, but the group's next call raises it). An async call's end event
    # stays with its handle.
    def _recycle_start(self, flight) -> None:
        if len(self._spare_events) < 1024:
            self._spare_events.append(flight.start)

    def _recycle_both(self, flight) -> None:
        if len(self._spare_events) < 1024:
            self._spare_events += (flight.start, flight.end)

    def bind_thread(self) -> None:
        """Set up the watchdog's thread: this GPU, and relaxed stream-capture mode. A rank
        capturing a graph in the default (global) mode would otherwise have its capture
        invalidated by the watchdog's event queries on this thread (seen with 3 ranks on one
        GPU, scripts/shared_gpu_smoke.py); the watchdog only queries events and writes
        signals, nothing a capture must be protected from."""
        torch.cuda.set_device(self.device)
        cu = driver()
        try:
            check(cu.cuThreadExchangeStreamCaptureMode(cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
        except (AttributeError, RuntimeError) as e:  # the watchdog still works; captures may then fail
            warnings.warn(f"conccl: the watchdog thread could not leave global stream-capture mode ({e}); "
                          "a CUDA graph captured while a conccl call is in flight may be invalidated", stacklevel=1)

    def read_pad(self) -> np.ndarray:
        """The own signal pad as the GPU sees it now (a copy on the watchdog's stream)."""
        with torch.cuda.stream(self._watch_stream):  # a plain device-to-host copy, no kernel
            return self._pad[:signal_pad_words(self.world)].cpu().numpy().view(np.uint32)

    def missing_peers(self, schedule: Schedule, seq: int) -> list[int]:
        """Peers whose signal call ``seq`` of ``schedule`` still waits for."""
        return awaited_peers(schedule, seq, self.read_pad(), self.world)

    def release(self, seq: int) -> None:
        """Satisfy every stream wait queued for calls up to ``seq`` (the group is broken), and
        every wait of a captured call: a replay stuck on a peer that never replays would
        otherwise hold the stream, and the eager calls queued behind it, for good."""
        own = self._pads[self.rank]
        words = signal_pad_words(self.world)
        for word in range(words):
            self._watch_ops.write_value32(own + 4 * word, seq)
        self._watch_ops.write_value32(self._spin_words, 1)  # a one-shot kernel's spins end
        with torch.cuda.stream(self._watch_stream):  # a failure path: a fill kernel is fine here
            # A pipeline's GEMM steps wait on marks that a stuck copy will never write.
            self._pad[mark_index(0, self.world, GRAPH_SLOTS):self._spin_index].fill_(_word(seq))
            if self._graph_slots_used:
                self._pad[words:words * (1 + self._graph_slots_used)].fill_(GRAPH_VALUE)
        self._watch_stream.synchronize()

    def close(self) -> None:
        """Drop the group's handles: its workspace, signal pad, symmetric registrations and
        compiled programs (the memory goes back to PyTorch's symmetric-memory allocator).

        A call still queued keeps them: its copies and signal writes would otherwise land in
        memory the allocator may hand out again (leaked, not corrupted)."""
        if self._last_end is not None and not self._last_end.query():
            return
        self._ws = self._ws_handle = None
        self._graph_ws = self._graph_ws_handle = None
        self._pad = self._pad_handle = None
        self.symmetric = SymmetricRegistry()
        self._drop_programs()
        self._by_shape.clear()
        if self._capture_stream is not None:
            settled_graphs.destroy_stream(self._capture_stream)
            self._capture_stream = None
        for stream in self._pipeline_streams or ():
            settled_graphs.destroy_stream(stream.cuda_stream)
        self._pipeline_streams = None

