"""Handles returned by ``async_op=True`` calls, shaped like ``torch.distributed.Work``."""
from __future__ import annotations

import time

from ..errors import CollectiveTimeout


# Where a call ran (``Work.path``): conccl's copy engines; the process group's own backend (an
# eager call below the group's ``nccl_below``: conccl.set_eager_path); or conccl's one-shot
# kernel, one CTA on an SM (a public function's call below ``Options.one_shot_below``).
COPY_ENGINES, NCCL, ONE_SHOT = "copy_engines", "nccl", "one_shot"


class Work:
    """A collective in flight. ``wait()`` makes the caller's current stream wait for it (the
    host does not block); ``is_completed()`` asks without waiting. Using the output or reusing
    the input before ``wait()`` is a race, as with ``torch.distributed``.

    If the collective failed (a peer died or timed out: the group's watchdog decided), every
    method that would hand out the output raises the error instead: ``wait()``,
    ``synchronize()``; ``exception()`` returns it and ``is_completed()`` is then True.
    """

    path = COPY_ENGINES  # or NCCL, ONE_SHOT

    def __init__(self, event=None, device=None, flight=None, path: str | None = None):
        # A CUDA event; None: completed when returned; or the reference executor's deferred
        # call, which has run_now() (its model of a stream the caller waits for).
        self._event = event
        self._device = device
        self._flight = flight  # the watchdog's record: carries the error if the call failed
        if path is not None:
            self.path = path

    def exception(self) -> BaseException | None:
        return None if self._flight is None else self._flight.failure()

    def _raise_if_failed(self) -> None:
        error = self.exception()
        if error is not None:
            raise error

    def wait(self, timeout=None) -> bool:
        """Order the caller's current stream after the collective (no host block).

        With ``timeout`` (seconds or a ``timedelta``) the host blocks instead, like torch's
        blocking wait, until the collective finished (True) or failed (raises).
        """
        self._raise_if_failed()
        if self._event is None:
            return True
        run_now = getattr(self._event, "run_now", None)
        if run_now is not None:
            run_now()
            return True
        if timeout is not None:
            self.synchronize(timeout)
            return True
        import torch  # here: `import conccl` (which loads this module) works without torch

        torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        return self._event is None or self.exception() is not None or self._event.query()

    def synchronize(self, timeout=None) -> None:
        """Block the host until the collective has finished on the GPU; raise if it failed.

        Polls (rather than ``cudaEventSynchronize``) so that the watchdog's verdict is seen
        the moment it is given. ``timeout`` bounds the wait on top of the group's own.
        """
        limit = None if timeout is None else getattr(timeout, "total_seconds", lambda: timeout)()
        deadline = None if limit is None else time.monotonic() + float(limit)
        pause = 20e-6
        run_now = getattr(self._event, "run_now", None)
        if run_now is not None:
            run_now()
        while self._event is not None and not self._event.query():
            self._raise_if_failed()
            if deadline is not None and time.monotonic() > deadline:
                what = self._flight.what if self._flight else "conccl collective"
                seq = self._flight.seq if self._flight else -1
                raise CollectiveTimeout(what, seq, [], float(limit))
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        self._raise_if_failed()

