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

import torch
from torch.distributed import _symmetric_memory as symm_mem

from ... import env
from ...device.driver import StreamOps, driver
from ...device.symmetric import CurrentStreams, SymmetricRegistry
from ...group.work import NCCL, Work
from ...schedule.base import MARK_WORDS, Schedule, Signal, StreamMode, mark_index, max_slots, pad_words, signal_word, \
    workspace_half
from ...schedule.captured import GRAPH_SLOTS, GRAPH_VALUE, primed_free_words
from ..base import GrowingWorkspace
from . import graph_launch as settled_graphs
from .capture import GraphCapture
from .program import BATCHING_MODES, probe_batching
from .programs import ProgramCache, pad_word
from .watch import WatchdogSide

# Calls between two refreshes of the eager mark words (:meth:`CudaCopyEngineExecutor._refresh_marks`):
# a mark is awaited with a 32-bit wrap-around comparison, so a word must never lag 2^31 calls.
MARK_REFRESH_CALLS = 1 << 30


SPIN_WORDS = 2  # after the marks: a one-shot kernel's abort word (the watchdog's) and timeout flag


class CudaCopyEngineExecutor(ProgramCache, GraphCapture, WatchdogSide, GrowingWorkspace):
    """Runs schedules on copy engines and stream memory operations. Its parts: the compiled
    programs and their graphs (:class:`~.programs.ProgramCache`), captured calls
    (:class:`~.capture.GraphCapture`), the watchdog's side (:class:`~.watch.WatchdogSide`)."""


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
        self._current_stream = CurrentStreams(self._device_index)  # the caller's current stream, fast
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
            self._pad[lo:lo + MARK_WORDS].fill_(pad_word(seq - 1))
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
        self._current_stream.close()
        self._drop_programs()
        self._by_shape.clear()
        if self._capture_stream is not None:
            settled_graphs.destroy_stream(self._capture_stream)
            self._capture_stream = None
        for stream in self._pipeline_streams or ():
            settled_graphs.destroy_stream(stream.cuda_stream)
        self._pipeline_streams = None

