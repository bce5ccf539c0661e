"""``conccl.fsdp.enable`` refuses, with no process, a module ``fully_shard`` never wrapped and
what is no module (FSDP2 on ranks conccl cannot serve: tests/multiproc/test_fsdp_fallback.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conccl import InvalidArgument, fsdp  # noqa: E402


def test_a_module_fully_shard_never_wrapped_is_refused():
    with pytest.raises(InvalidArgument, match="fully_shard"):
        fsdp.enable(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    with pytest.raises(InvalidArgument, match="torch.nn.Module"):
        fsdp.enable("model")
