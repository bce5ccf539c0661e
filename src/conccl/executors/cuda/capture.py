"""Calls captured into CUDA graphs on the copy-engine executor: their own signal words (a graph
slot's block of the pad), their own region of a workspace reserved before capture, one
cuMemcpyAsync per copy, and a pipeline's marks as graph edges.

:class:`GraphCapture` is a part of :class:`~.executor.CudaCopyEngineExecutor` (its methods run
on the executor's state).
"""
from __future__ import annotations

import dataclasses

import torch

from ...device.driver import driver
from ...errors import InvalidArgument
from ...schedule.base import Schedule, mark_index, signal_pad_words
from ...schedule.captured import GRAPH_SLOTS, GRAPH_VALUE, mark_edges, mark_edges_on
from .program import CompiledProgram
from .lowering import lower
from .programs import buffer_addresses
from .settled_pipeline import Piece, queue_captured


class GraphCapture:
    """Reserving graph workspace and capturing a call (:meth:`capture_call`)."""

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
        address = buffer_addresses(self.rank, input, output, views, ws_base)
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
