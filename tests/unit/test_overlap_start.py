"""``conccl.overlap(...).start`` refuses, with no process, anything but an open persistent op (the
persistent ops started on ranks: tests/multiproc/test_persistent.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl.errors import InvalidArgument  # noqa: E402


def test_overlap_start_refuses_anything_but_an_open_persistent_op():
    import conccl
    from conccl.group.persistent import PersistentCollective

    c3 = conccl.overlap(plan="conccl")
    with pytest.raises(InvalidArgument, match="PersistentCollective"):
        c3.start(lambda: None)
    from conccl.collectives import REGISTRY

    closed = PersistentCollective(object(), 1, REGISTRY["all_gather"], None, None, torch.zeros(4), torch.zeros(8), 1.0)
    closed.close()
    with pytest.raises(InvalidArgument, match="closed"):
        c3.start(closed)
