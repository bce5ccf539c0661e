"""Exceptions raised by conccl."""
from __future__ import annotations

from .validate import InvalidArgument

try:  # torch's own distributed error, so `except torch.distributed.DistError` catches ours too
    from torch.distributed import DistError as _DistError
except Exception:  # pragma: no cover - torch built without distributed
    _DistError = RuntimeError


class CollectiveError(_DistError):
    """A collective could not complete (a peer is missing, mismatched, or the group is broken)."""


class CollectiveTimeout(CollectiveError):
    """Peers did not arrive within the timeout."""

    def __init__(self, what: str, seq: int, missing: list[int], waited_s: float):
        self.what, self.seq, self.missing, self.waited_s = what, seq, missing, waited_s
        super().__init__(
            f"{what} (sequence number {seq}) timed out after {waited_s:.1f} s waiting for rank(s) "
            f"{', '.join(map(str, missing))}"
        )


class UnsupportedGroup(CollectiveError):
    """The group's GPUs cannot all reach each other with peer access."""


__all__ = ["InvalidArgument", "CollectiveError", "CollectiveTimeout", "UnsupportedGroup"]
