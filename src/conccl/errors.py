"""Exceptions raised by conccl.

:class:`InvalidArgument` is a ``ValueError``. Every failure of a collective is a
:class:`CollectiveError`, itself a ``torch.distributed.DistError``, so code written for torch's
errors catches ours too.

The four collective errors derive from a class of torch's, so they are made on first use (this
module's ``__getattr__``), once per process: ``import conccl.errors`` (and ``import conccl``)
loads no torch, and ``from conccl.errors import CollectiveError`` loads it where the error is
needed. Without torch.distributed their base is ``RuntimeError``.
"""
from __future__ import annotations

import threading

from .validate import InvalidArgument

_COLLECTIVE_ERRORS = ("CollectiveError", "CollectiveTimeout", "GroupBroken", "UnsupportedGroup")
_making = threading.Lock()  # two threads asking first get the same classes


def _make_collective_errors() -> dict:
    try:  # torch's own distributed error, so `except torch.distributed.DistError` catches ours too
        from torch.distributed import DistError as base
    except Exception:  # torch missing, or built without distributed
        base = RuntimeError

    class CollectiveError(base):
        """A collective could not complete (a peer is missing, mismatched, or the group is broken)."""

    class CollectiveTimeout(CollectiveError):
        """Peers did not arrive within the timeout.

        ``what`` names the collective, ``seq`` its sequence number on the group, ``missing`` the
        ranks that did not arrive (``exited`` those of them whose process is gone) and
        ``waited_s`` the time waited.
        """

        def __init__(self, what: str, seq: int, missing: list[int], waited_s: float,
                     exited: list[int] | None = None, note: str = ""):
            self.what, self.seq, self.missing, self.waited_s = what, seq, list(missing), waited_s
            self.exited, self.note = sorted(exited or []), note
            gone = f" (process of rank(s) {', '.join(map(str, self.exited))} has exited)" if self.exited else ""
            verb = "gave up" if self.exited else "timed out"
            super().__init__(
                f"{what} (sequence number {seq}) {verb} after {waited_s:.1f} s waiting for rank(s) "
                f"{', '.join(map(str, self.missing)) or '?'}{gone}"
                + (f"; {note}" if note else "")
            )

        def __reduce__(self):  # picklable across processes (the test spawner sends errors back)
            return type(self), (self.what, self.seq, self.missing, self.waited_s, self.exited, self.note)

    class GroupBroken(CollectiveError):
        """An earlier collective on the group failed (on this rank or a peer); ``cause`` says how.

        A group that timed out is never used again: its peers may be dead or one call behind, and
        its signal words no longer follow the protocol. Destroy it and build a new one.
        """

        def __init__(self, message: str, cause: BaseException | None = None):
            self.cause = cause
            super().__init__(message)

    class UnsupportedGroup(CollectiveError):
        """The group's GPUs cannot all reach each other with peer access."""

    made = {c.__name__: c for c in (CollectiveError, CollectiveTimeout, GroupBroken, UnsupportedGroup)}
    for c in made.values():
        c.__qualname__ = c.__name__  # pickle finds them by name, as conccl.errors.<name>
    return made


def __getattr__(name):
    if name in _COLLECTIVE_ERRORS:
        with _making:
            if name not in globals():
                globals().update(_make_collective_errors())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["InvalidArgument", "CollectiveError", "CollectiveTimeout", "GroupBroken", "UnsupportedGroup"]
