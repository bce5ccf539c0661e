"""What the group's watchdog asks of the copy-engine executor: the own signal pad as the GPU sees
it, the peers a call still waits for, and the release of every wait once the group is broken;
and the spare events of finished calls.

:class:`WatchdogSide` is a part of :class:`~.executor.CudaCopyEngineExecutor` (its methods run
on the executor's state).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from ...device.driver import check, driver
from ...schedule.base import Schedule, awaited_peers, mark_index, signal_pad_words
from ...schedule.captured import GRAPH_SLOTS, GRAPH_VALUE
from .programs import pad_word


class WatchdogSide:
    """The watchdog's reads and writes of the pad, from its own thread and stream."""

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
            self._pad[mark_index(0, self.world, GRAPH_SLOTS):self._spin_index].fill_(pad_word(seq))
            if self._graph_slots_used:
                self._pad[words:words * (1 + self._graph_slots_used)].fill_(GRAPH_VALUE)
        self._watch_stream.synchronize()
