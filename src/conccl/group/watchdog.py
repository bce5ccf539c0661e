"""A host thread that keeps a group's GPU collectives from hanging.

A copy-engine collective waits for its peers with stream waits (``cuStreamWaitValue32``) that
the GPU runs, not the host: if a peer dies after the host handshake, the wait never ends and
neither does anything queued behind it, process exit included. The watchdog tracks every
call in flight as a :class:`Flight` (its start and end events); when the oldest one has been
running on the GPU longer than its timeout, or a peer it still waits for has exited, it asks
the group to fail: the group is marked broken, the stream waits are released (so the stream
drains and the process can exit), and every flight in progress carries the error, which
``Work.wait()`` and ``Work.synchronize()`` raise instead of handing out a half-filled output.

The timeout counts from when the collective starts on the GPU (its start event completes),
not from the host call, so work queued before it on the caller's stream does not count.
Nothing here touches a device itself: events and the two callbacks come from the executor,
so the logic is tested on CPU with stand-ins.
"""
from __future__ import annotations

import collections
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(eq=False)
class Flight:
    """One collective call in flight on the GPU."""

    seq: int
    what: str
    timeout_s: float
    start: Any  # has query() -> bool (a CUDA event)
    end: Any
    schedule: Any = None
    # Asked by the handle after the call finished: did a peer give up on this call meanwhile?
    # (This rank was then too slow; what it received cannot be trusted.)
    late_verdict: Callable | None = field(default=None, repr=False)
    # Called with the flight once it is finished and forgotten (the executor reuses its start event).
    recycle: Callable | None = field(default=None, repr=False)
    started_at: float | None = None
    error: BaseException | None = field(default=None, repr=False)

    def done(self) -> bool:
        return self.error is not None or self.end.query()

    def failure(self) -> BaseException | None:
        # The late verdict is for a call that *finished*: one still running belongs to the
        # watchdog, which must release its stream waits before anyone gives up on it.
        if self.error is None and self.late_verdict is not None and self.end is not None and self.end.query():
            self.error = self.late_verdict(self.seq)
        return self.error


class Watchdog:
    """Polls the flights of one group every ``poll_s`` seconds on a daemon thread.

    ``judge(flight, running_s)`` returns an exception when the oldest unfinished flight must
    fail (or None); ``fail(error)`` then breaks the group, takes every flight with
    :meth:`drain` (which marks them failed) and releases the GPU. ``thread_init`` runs first on the
    thread (binding it to the group's device).
    """

    def __init__(self, judge: Callable, fail: Callable, poll_s: float = 0.05, thread_init: Callable | None = None,
                 name: str = "conccl-watchdog", start: bool = True):
        self._judge, self._fail, self.poll_s, self._init = judge, fail, poll_s, thread_init
        self._flights: collections.deque[Flight] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        if start:  # start=False: the caller drives poll() itself (tests with a fake clock)
            self._thread.start()

    def track(self, flight: Flight) -> None:
        with self._cv:
            self._flights.append(flight)
            self._cv.notify()

    def in_flight(self) -> int:
        """Calls queued and not finished (finished ones are dropped here too)."""
        with self._cv:
            self._prune()
            return len(self._flights)

    def _prune(self) -> None:
        """Drop finished flights (under the lock). Calls of a group run in order on the GPU, so
        finished ones are at the front, and when the newest is done all are: one query covers
        the hundreds of calls a busy group finishes between two rounds."""
        flights = self._flights
        if flights and flights[-1].done():
            done = list(flights)
            flights.clear()
        else:
            done = []
            while flights and flights[0].done():
                done.append(flights.popleft())
        for f in done:
            if f.recycle is not None and f.error is None:
                f.recycle(f)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ thread
    def _loop(self) -> None:
        if self._init is not None:
            try:
                self._init()
            except Exception as e:  # noqa: BLE001 - no watchdog: the group must not be used
                traceback.print_exc()
                self._fail(RuntimeError(f"conccl watchdog could not start: {type(e).__name__}: {e}"))
                return
        while True:
            with self._cv:
                if not self._flights and not self._closed:
                    self._cv.wait()  # idle: no polling while nothing is in flight
                if self._closed:
                    return
            try:
                self.poll()
            except Exception as e:  # noqa: BLE001 - a dead watchdog would leave the GPU stuck for good
                error = RuntimeError(f"conccl watchdog failed: {type(e).__name__}: {e}")
                traceback.print_exc()
                try:
                    self._fail(error)
                except Exception:  # noqa: BLE001
                    traceback.print_exc()
                return
            time.sleep(self.poll_s)

    def poll(self, now: float | None = None) -> BaseException | None:
        """One round (also called directly by tests): drop finished flights, judge the oldest."""
        now = time.monotonic() if now is None else now
        with self._cv:
            self._prune()
            flights = list(self._flights)
        for f in flights:
            if f.started_at is not None:
                continue
            if not f.start.query():
                break  # later calls cannot have started either
            f.started_at = now
        if not flights or flights[0].started_at is None:
            return None
        oldest = flights[0]
        error = self._judge(oldest, now - oldest.started_at)
        if error is not None:
            self._fail(error)
        return error

    def drain(self, error: BaseException) -> list[Flight]:
        """Remove every flight, marking it failed with ``error``; returns them (for ``fail``)."""
        with self._cv:
            pending = list(self._flights)
            self._flights.clear()
        for f in pending:
            f.error = error
        return pending
