"""Handles returned by ``async_op=True`` calls, shaped like ``torch.distributed.Work``."""
from __future__ import annotations


class Work:
    """A collective in flight. ``wait()`` makes the caller's current stream wait for it (the
    host does not block); ``is_completed()`` asks without waiting. Using the output or reusing
    the input before ``wait()`` is a race, as with ``torch.distributed``."""

    def __init__(self, event=None, device=None):
        self._event = event  # None: completed when returned (the CPU reference executor)
        self._device = device

    def wait(self, timeout=None) -> bool:
        if self._event is not None:
            import torch

            torch.cuda.current_stream(self._device).wait_event(self._event)
        return True

    def is_completed(self) -> bool:
        return self._event is None or self._event.query()

    def synchronize(self) -> None:
        """Block the host until the collective has finished on the GPU."""
        if self._event is not None:
            self._event.synchronize()
