"""A Group owns its state: closing it (or conccl.destroy()) leaves no shared-memory segment,
thread or file descriptor behind, however many groups come and go in one process."""
from __future__ import annotations

import os
import threading

import pytest

torch = pytest.importorskip("torch")

from conccl import api  # noqa: E402
from conccl.testing import new_reference_group, spawn  # noqa: E402

ROUNDS = 100


def _segments(prefix: str) -> int:
    return sum(1 for name in os.listdir("/dev/shm") if name.startswith(prefix))


def _resources(prefix: str) -> dict:
    return {"segments": _segments(prefix), "threads": threading.active_count(),
            "fds": len(os.listdir("/proc/self/fd"))}


def _create_and_destroy(parent, rounds):
    seen, wrong = [], 0
    for i in range(rounds):
        g = new_reference_group(parent, f"g{i}")
        w, r = g.world, g.rank
        out = torch.empty(w * 256)
        g.all_gather_into_tensor(out, torch.full((256,), float(r + i)))  # staged: grows a workspace
        op = g.persistent_all_to_all_single(torch.empty(w * 8), torch.arange(w * 8, dtype=torch.float32))
        op.start()
        wrong += int(not torch.equal(out, (torch.arange(w) + i).float().repeat_interleave(256)))
        if i % 10 == 9:  # conccl.destroy() closes every group the API holds
            api._GROUPS[g.name] = g
            api.destroy()
            assert not api._GROUPS
        else:
            g.close()
        assert g.closed and op.closed
        parent.board.exchange([], "round done", 10.0)  # every rank closed before counting
        if i in (0, rounds - 1):
            # this round's group only: a peer may already be making the next one
            seen.append(_resources(f"{parent.name}_g{i}_"))
    return wrong, seen


def test_a_hundred_groups_come_and_go_without_leaking():
    for wrong, (first, last) in spawn(2, _create_and_destroy, ROUNDS):
        assert wrong == 0
        assert last["segments"] == 0 and first["segments"] == 0, (first, last)
        assert last["threads"] == first["threads"], (first, last)
        assert last["fds"] == first["fds"], (first, last)


def _leaky(parent, rounds):
    """The same loop, but the groups are never closed: the counts must show it."""
    kept = [new_reference_group(parent, f"g{i}") for i in range(rounds)]
    parent.board.exchange([], "made", 10.0)
    n = _segments(f"{parent.name}_g")
    for g in kept:
        g.close()
    return n


def test_the_leak_check_sees_groups_left_open():
    assert all(n >= 3 for n in spawn(2, _leaky, 3))  # board + a pad per rank, per group
