"""Group.agree (and across simulated hosts, HierarchicalGroup.agree): every rank learns whether
all passed the same text; where one differs, every rank raises, naming it. The runtime agrees on
its hardware profile so (conccl.runtime.agreed_profile)."""
from __future__ import annotations

import pytest

from conccl.errors import InvalidArgument
from conccl.testing import spawn, spawn_hosts


def _agree(comm, texts):
    seen = [comm.rank]
    for text in texts(comm.rank):
        try:
            comm.agree(text, "hardware profile", "make them equal")
            seen.append("same")
        except InvalidArgument as e:
            seen.append(str(e))
    return seen


def _odd_rank_differs(rank):
    return ["shipped h100x2", "shipped h100x2" if rank % 2 == 0 else "fallback", "again"]


def _host_one_differs(rank):
    return ["shipped h100x2", "fallback" if rank >= 2 else "shipped h100x2", "again"]


@pytest.mark.parametrize("world", [2, 3])
def test_one_group_agrees_or_every_rank_raises(world):
    for rank, *seen in spawn(world, _agree, _odd_rank_differs):
        assert seen[0] == "same" and seen[2] == "same"  # a refusal leaves the group usable
        other = 1 if rank % 2 == 0 else 0  # the first rank whose text differs from this one's
        assert f"rank {other} has another hardware profile than rank {rank}" in seen[1], seen
        assert "make them equal" in seen[1]


def test_hosts_that_differ_are_refused_on_every_rank():
    """2 simulated hosts x 2 ranks, host 1's ranks alike among themselves: only the cross-host
    step can see it."""
    for rank, *seen in spawn_hosts("2x2", _agree, _host_one_differs):
        assert seen[0] == "same" and seen[2] == "same"
        host, other = rank // 2, 1 - rank // 2
        assert f"host {other} has another hardware profile than host {host}" in seen[1], seen
