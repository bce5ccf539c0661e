"""A settled eager pipeline (a ``conccl.tp`` call) captured once as a CUDA graph and launched
whole.

An eager pipelined call costs ~0.3-0.5 ms of host time on 2 x H200 (docs/results.md,
host time): the driver calls of four streams, two ``torch.mm`` launches, events. Called
again on the same buffers (a decode loop, a layer's steps), from the GRAPH_AFTER-th call with
the same GEMM-step buffers its whole program (every slot, its GEMM steps included) is one graph,
whose stream memory operations get the call's sequence number per launch
(:mod:`conccl.executors.cuda.graph_launch`): the same operations, in the same order, with the
same values as the driver calls would queue, so a peer need not take the same route. Keyed by
what the GEMM steps touch (``compute.buffers``, conccl.tp's tensors' address, shape, strides,
dtype) besides the program's buffers; only for blocking calls (an async call's tensors are
marked in use on the streams its steps ran on, which a replay does not run on); and only where
every copy is between GPUs (:func:`~conccl.executors.cuda.graph_launch.same_gpu_copies`: a pull
pipeline staging a plain shard keeps its driver calls; one reading ``conccl.empty`` shards and
every push or GEMM+reduce-scatter pipeline are graphed).
"""
from __future__ import annotations

import dataclasses
import time
import warnings
from typing import NamedTuple

import torch

from ...device.driver import driver
from ...schedule.captured import mark_edges, mark_edges_on
from . import graph_launch as settled_graphs
from .program import CompiledProgram

# Buffer sets a program keeps counts and graphs for, the least recently used dropped first: one
from .lowering import lower
# program serves every layer whose activations land at the same addresses (its weights differ),
# so a decode step cycles through as many sets as it has such layers.
MAX_PIPELINE_GRAPHS = 64


class TorchCapture:
    """A settled pipeline captured by PyTorch's CUDAGraph into the executor's memory pool (the
    ``capture`` of :class:`~conccl.executors.cuda.graph_launch.SettledGraph`). Its GEMM steps'
    cuBLAS kernels use the workspace PyTorch keeps per stream. The steps are captured on raw
    streams of the executor's own that run nothing else (``_pipeline_streams``; not PyTorch's
    pooled streams, which other work shares), so that workspace is allocated during the first
    capture, in the pool: a workspace of an eagerly used stream would be ordinary allocator
    memory, which ``torch._C._cuda_clearCublasWorkspaces()`` (users call it) hands back, and a
    replay could then write into another tensor. The pool is a ``torch.cuda.MemPool`` the
    executor keeps (a bare pool id dies with the last graph using it, and a capture into it then
    fails), shared by every graph: they run one after another in the group's stream order, so
    sharing a workspace block is safe.

    A capture that fails in ``capture_begin`` or ``capture_end`` has the pool's allocation
    routing ended here, and its CUDAGraph kept in ``keep`` for the executor's life: PyTorch's
    routing may still refer to it."""

    def __init__(self, pool, device_index: int, keep: list):
        self.pool, self.device_index, self.keep = pool, device_index, keep
        self.graph = self.stream = None

    def begin(self, handle: int) -> None:
        self.graph = torch.cuda.CUDAGraph(keep_graph=True)
        self.stream = torch.cuda.ExternalStream(handle, device=self.device_index)
        try:
            with torch.cuda.stream(self.stream):
                self.graph.capture_begin(pool=self.pool.id, capture_error_mode="thread_local")
        except BaseException:
            self._abandon()
            raise

    def end(self) -> int:
        try:
            with torch.cuda.stream(self.stream):
                self.graph.capture_end()
        except BaseException:
            # capture_end raised (a stream left unjoined) before routing allocations back:
            # undo it, or every later capture into the pool fails and freed blocks are held
            self._abandon()
            raise
        return self.graph.raw_cuda_graph()

    def instantiate(self) -> int:
        self.graph.instantiate()
        return self.graph.raw_cuda_graph_exec()

    def _abandon(self) -> None:
        try:
            torch._C._cuda_endAllocateToPool(self.device_index, self.pool.id)
        except Exception:  # noqa: BLE001 - the capture's own error is the one to report
            pass
        self.keep.append(self.graph)
        self.graph = None

    def close(self) -> None:
        self.graph = None  # PyTorch destroys the graph and its exec


class Piece(NamedTuple):
    """What a pipeline's capture queues in turn (:func:`queue_captured`): slot ``index`` of
    ``program`` (whose lowered steps are ``steps``) on the stream of pipeline slot ``slot``,
    after waiting for the events of ``waits`` (mark words) and before recording one for each
    of ``records``."""

    slot: int
    waits: tuple
    records: tuple
    program: CompiledProgram
    index: int
    steps: tuple


def _pieces(ex, schedule, address) -> list:
    """``schedule`` (an eager pipeline) lowered for a settled graph: where its marks become
    graph edges (:func:`conccl.schedule.captured.mark_edges`, as a captured pipeline's do), one piece per
    segment, lowered alone; else one per slot of the whole program. An edge leaves no stream
    memory operation between two GEMM steps (~5 us of GPU idle at decode size) and
    no node whose value a launch must set. The marks are this rank's own words: a peer on
    driver calls awaits none of them, so ranks may still take different routes."""
    def lowered(s):
        return lower(s, address, ex._pads, ex.batching, batch_copies=False, marks=ex._marks,
                     spin_words=ex._spin_words)

    if mark_edges_on():
        pieces = []
        for seg in mark_edges(schedule):
            steps = lowered(dataclasses.replace(schedule, slots=(seg.ops,)))
            pieces.append(Piece(seg.slot, seg.waits, seg.records, CompiledProgram(steps, driver(), ex._device_index),
                                 0, steps[0]))
        return pieces
    steps = lowered(schedule)
    program = CompiledProgram(steps, driver(), ex._device_index)
    return [Piece(k, (), (), program, k, slot) for k, slot in enumerate(steps)]


def queue_captured(pieces, origin, cu_origin, side, seq: int, on) -> list:
    """Queue ``pieces`` (:class:`Piece`) on ``origin``, a stream being captured (``cu_origin``:
    its driver handle), as :meth:`CudaCopyEngineExecutor.run` queues a pipeline's slots: a fork
    recorded on ``origin`` before anything (the control slot waits for the peers' signals of
    this call, which the other slots' copies let them send: a push pipeline's graph forked after
    it hung on 2 x H200); every other slot on ``side(slot)`` -> (stream, driver
    handle), waiting for the fork first; an event recorded after a mark's writer and waited on
    before its awaiter (a graph edge); each side stream joined back into ``origin`` whatever
    happens (a capture must end on a joined graph). ``on(stream)``: the GEMM steps as called on
    ``stream`` (None: none). The events, for the caller to keep while the capture needs them."""
    fork = torch.cuda.Event()
    if any(piece.slot for piece in pieces):
        fork.record(origin)
    streams = {0: (origin, cu_origin)}
    edges: dict = {}
    joins = []
    try:
        for piece in pieces:
            if piece.slot not in streams:
                stream, cu_stream = side(piece.slot)
                stream.wait_event(fork)
                streams[piece.slot] = (stream, cu_stream)
            stream, cu_stream = streams[piece.slot]
            for word in piece.waits:
                stream.wait_event(edges[word])
            piece.program.launch_slot(piece.index, cu_stream, seq, on(stream))
            for word in piece.records:
                edges[word] = torch.cuda.Event()
                edges[word].record(stream)
    finally:
        for k, (stream, _) in streams.items():
            if k:
                joins.append(torch.cuda.Event())
                joins[-1].record(stream)
                origin.wait_event(joins[-1])
    return [fork, *edges.values(), *joins]


def _record(entry, buffers):
    """``entry``'s [calls, graph] for ``buffers``, the most recently used last; the least
    recently used set is dropped (its graph closed) to make room."""
    pipelines = entry.pipelines
    record = pipelines.pop(buffers, None)
    if record is None:
        record = [0, None]
        while len(pipelines) >= MAX_PIPELINE_GRAPHS:
            _, graph = pipelines.pop(next(iter(pipelines)))
            if graph:
                graph.close()
    pipelines[buffers] = record
    return record


def settled_pipeline(ex, entry, buffers: tuple, make_compute, addresses):
    """The graph of ``entry`` (the executor ``ex``'s cached program of a pipeline) whose GEMM
    steps touch ``buffers``, once this is the GRAPH_AFTER-th call with them since ``entry`` was
    made, made now; None before; False where it cannot have one (its calls stay driver calls).
    ``make_compute()``: the GEMM steps as the capture calls them (made only for a capture: a
    launch needs none). ``addresses()``: the program's ``address(rank, buf)`` for lowering. The
    slots are forked from the capture stream before the control slot and joined back, as
    :meth:`CudaCopyEngineExecutor.run` queues them; the other slots on streams of their own
    (:class:`TorchCapture`). After a failed capture none is tried again on this executor: a
    capture that failed midway may leave PyTorch's capture state behind."""
    record = _record(entry, buffers)
    record[0] += 1
    if record[1] is not None or record[0] < settled_graphs.GRAPH_AFTER:
        return record[1]
    record[1] = False
    if not (settled_graphs.available() and not ex._pipeline_graphs_off
            and settled_graphs.graphable_pipeline(entry.lowered)
            and not settled_graphs.same_gpu_copies(entry.schedule)):
        return False
    t0 = time.perf_counter()
    try:
        pieces = _pieces(ex, entry.schedule, addresses())
        with torch.cuda.device(ex._device_index):  # the pool and the streams are this device's
            if ex._capture_stream is None:
                ex._capture_stream = settled_graphs.create_stream()
            if ex._pipeline_pool is None:
                ex._pipeline_pool = torch.cuda.MemPool()
                ex._pipeline_streams = [torch.cuda.ExternalStream(settled_graphs.create_stream(),
                                                                  device=ex._device_index) for _ in ex._streams]
        compute = make_compute()

        def queue(handle, seq):  # the eager fork and join, captured; marks as edges between them
            def side(k):
                stream = ex._pipeline_streams[k]
                return stream, ex._cu_stream(stream)
            queue_captured(pieces, torch.cuda.ExternalStream(handle, device=ex._device_index),
                           driver().CUstream(handle), side, seq, lambda stream: ex._on(stream, compute))

        steps = tuple(step for piece in pieces for step in piece.steps)
        record[1] = settled_graphs.SettledGraph(
            pieces[0].program, steps, ex._capture_stream, driver(), queue=queue,
            capture=TorchCapture(ex._pipeline_pool, ex._device_index, ex._graph_keep))
        ex.programs_graphed += 1
        ex.pipelines_graphed += 1
    except Exception as e:  # noqa: BLE001 - any failure here leaves the driver calls, which work
        ex.graph_failures += 1
        ex._pipeline_graphs_off = True
        # the capture stream may still be capturing (a capture_end that raised before ending
        # it): the flat settled graphs get a new one; this one is left as it is
        ex._capture_stream = None
        cause = e.__context__  # what failed first, where ending the capture failed too
        first = f"; first {type(cause).__name__}: {cause}" if cause is not None else ""
        warnings.warn(f"conccl: a settled {entry.schedule.collective} pipeline could not be captured as a graph "
                      f"({type(e).__name__}: {e}{first}); this group's pipelines stay driver calls", stacklevel=2)
    ex.program_compile_s += time.perf_counter() - t0
    return record[1]
