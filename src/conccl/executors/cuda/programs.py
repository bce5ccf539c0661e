"""The copy-engine executor's compiled programs, one per (schedule, buffers), and what a settled
one becomes: its driver calls launched as one CUDA graph (:mod:`.graph_launch`), a settled
pipeline's whole program captured (:mod:`.settled_pipeline`).

:class:`ProgramCache` is a part of :class:`~.executor.CudaCopyEngineExecutor` (its methods run
on the executor's state: the pads, the workspace, the streams), kept here so that the executor
module holds the call path and this one what the call path looks up.
"""
from __future__ import annotations

import time
import warnings

from ...device.driver import driver
from ...schedule.base import Buf, Schedule
from . import graph_launch as settled_graphs
from .program import CompiledProgram
from .lowering import lower, shape
from .settled_pipeline import settled_pipeline


def pad_word(value: int) -> int:
    """``value``'s low 32 bits as the int32 a pad word holds (what a stream memory operation
    writes of a sequence number; ``fill_`` of an int32 tensor refuses a value past 2^31 - 1)."""
    value &= 0xFFFFFFFF
    return value - ((value >> 31) << 32)


MAX_PROGRAMS = 256  # compiled (schedule, buffers) pairs kept per group


def buffer_addresses(own_rank: int, input, output, views, workspace):
    """``address(rank, buf)`` for lowering: a buffer's base as this rank reaches it (its own
    tensors directly, a peer's through the agreed views, every rank's workspace by its base)."""
    sym_in, sym_out = views

    def address(rank, buf):
        if buf is Buf.WORKSPACE:
            return workspace[rank]
        t, sym = (input, sym_in) if buf is Buf.INPUT else (output, sym_out)
        return t.data_ptr() if rank == own_rank else sym[0][rank] + sym[1][rank]

    return address


class CachedProgram:
    """A compiled program cached for one (schedule, buffers): how many calls ran it, and its
    settled graph once it has one (None: not yet tried; False: cannot have one)."""

    __slots__ = ("schedule", "views", "ws", "program", "lowered", "uses", "graph", "pipelines")

    def __init__(self, schedule, views, ws, program, lowered):
        self.schedule, self.views, self.ws, self.program, self.lowered = schedule, views, ws, program, lowered
        self.uses, self.graph = 0, None
        # A pipeline's graphs, by the buffers its GEMM steps touch: [calls, graph or None/False],
        # the most recently used last (conccl.executors.cuda.settled_pipeline)
        self.pipelines: dict = {}

    def close_graphs(self) -> None:
        """Destroy its graphs (a launch still queued runs: the driver frees it after)."""
        if self.graph:
            self.graph.close()
        for _, graph in self.pipelines.values():
            if graph:
                graph.close()
        self.pipelines.clear()


class ProgramCache:
    """The executor's programs by (schedule, buffers), and their graphs once settled."""

    def _program(self, schedule: Schedule, input, output, views, seq: int) -> CachedProgram:
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
        address = buffer_addresses(self.rank, input, output, views, ws)
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
            if len(self._by_shape) >= MAX_PROGRAMS:  # a one-shot call's shape holds its buffers' addresses
                self._by_shape.clear()
            program = self._by_shape[form] = CompiledProgram(lowered, driver(), self._device_index)
            self.programs_compiled += 1
        self.program_compile_s += time.perf_counter() - t0
        if len(self._programs) >= MAX_PROGRAMS:
            self._drop_programs()
        if hit is not None:  # a stale entry under this key (other views, workspace)
            hit.close_graphs()
        entry = self._programs[key] = CachedProgram(schedule, views, ws, program, lowered)
        return entry

    def _drop_programs(self) -> None:
        for entry in self._programs.values():
            entry.close_graphs()
        self._programs.clear()

    def _settled_graph(self, entry: CachedProgram, input, output, views):
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
            steps = lower(schedule, buffer_addresses(self.rank, input, output, views, entry.ws), self._pads,
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

    def _settled_pipeline(self, entry: CachedProgram, buffers: tuple, make_compute, input, output, views):
        """A settled pipeline's graph (:func:`conccl.executors.cuda.settled_pipeline.settled_pipeline`)."""
        return settled_pipeline(self, entry, buffers, make_compute, lambda: buffer_addresses(self.rank, input, output,
                                                                                      views, entry.ws))
