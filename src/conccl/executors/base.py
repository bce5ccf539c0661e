"""The Executor protocol: what a :class:`~conccl.group.Group` needs from whatever runs schedules,
and the workspace growth every executor shares (:class:`GrowingWorkspace`).

Two executors implement it: :mod:`conccl.executors.cuda.executor` (copy engines and stream memory
operations on CUDA GPUs) and :mod:`conccl.executors.reference` (CPU processes over shared
memory, for tests). A schedule is plain data (:mod:`conccl.schedule.base`), so any executor runs
any collective's schedule.
"""
from __future__ import annotations

import abc
import math
from typing import Protocol

from ..schedule.base import Schedule


class Executor(Protocol):
    device_type: str  # "cuda" or "cpu": the device the collectives' tensors must be on
    tracks_flights: bool  # True: calls stay in flight after run() returns; the group's watchdog tracks them

    @property
    def views_generation(self) -> int:
        """Changes whenever what :meth:`peer_view` answers for some address may have changed."""

    def peer_view(self, t) -> tuple | None:
        """How peers reach tensor ``t`` (an opaque handle, byte offset, the number of the mapped
        allocation holding it, alike on every rank), None if they cannot."""

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the group's symmetric workspace now (0 before the first call that stages)."""

    def ensure_workspace(self, nbytes: int) -> None:
        """Grow the group's symmetric workspace to ``nbytes`` (a collective call: every rank
        comes with the same size, decided from the board)."""

    def run(self, schedule: Schedule, input, output, seq: int, async_op: bool, timeout_s: float, flight, views):
        """Queue (CUDA) or run (reference) ``schedule`` as call ``seq``; return a :class:`~conccl.group.work.Work`."""

    def close(self) -> None:
        """Release every allocation and handle."""


def workspace_capacity(nbytes: int) -> int:
    """Workspace sizes grow in powers of two (>= 1 MiB) so growth, a collective allocation, is rare."""
    return 0 if nbytes <= 0 else max(1 << 20, 1 << math.ceil(math.log2(nbytes)))


class GrowingWorkspace(abc.ABC):
    """The :class:`Executor` protocol's workspace half, alike for every executor: the workspace
    only grows, to :func:`workspace_capacity`; how it is mapped with the peers is the
    executor's :meth:`_map_workspace`."""

    _ws_cap = 0  # bytes mapped now

    @property
    def workspace_bytes(self) -> int:
        return self._ws_cap

    def ensure_workspace(self, nbytes: int) -> None:
        if nbytes <= self._ws_cap:
            return
        cap = workspace_capacity(nbytes)
        self._map_workspace(cap)
        self._ws_cap = cap

    @abc.abstractmethod
    def _map_workspace(self, nbytes: int) -> None:
        """Replace the workspace with ``nbytes`` mapped on every rank (a collective call: every
        rank comes with the same size, decided from the board, after its previous calls)."""
