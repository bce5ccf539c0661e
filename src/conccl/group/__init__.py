"""One :class:`Group` per process group: the state conccl keeps for it, closed in one call.

The group's parts load on first use (``conccl.group.Group``), so that ``import conccl`` (which
takes :class:`~.work.Work` and :class:`~.persistent.PersistentCollective` from here) stays
free of PyTorch. The call protocol's parts: :mod:`.row` (the board row), :mod:`.local` (the
local step), :mod:`.agreement` (agree / post / settle / mismatch), :mod:`.options`,
:mod:`.group` (calls, capture and execution, failure verdicts); :class:`CollectiveGroup`
names what a :class:`Group` and a :class:`~.hierarchical.HierarchicalGroup` both offer."""
from __future__ import annotations

import importlib

_WHERE = {"Group": "group", "Options": "options", "DEFAULT_TIMEOUT": "options", "board_row_len": "row",
          "CollectiveGroup": "protocol"}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_WHERE)
