"""One :class:`Group` per process group: the state conccl keeps for it, closed in one call.

The group's parts load on first use (``conccl.group.Group``), so that ``import conccl`` (which
takes :class:`~.work.Work` and :class:`~.persistent.PersistentCollective` from here) stays
free of PyTorch."""
from __future__ import annotations

import importlib

_FROM_GROUP = {"Group", "Options", "DEFAULT_TIMEOUT", "board_row_len"}


def __getattr__(name):
    if name in _FROM_GROUP:
        return getattr(importlib.import_module(f"{__name__}.group"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_FROM_GROUP)
