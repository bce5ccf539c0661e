"""A late, dead or mismatched peer never hangs or corrupts a collective.

CPU multi-process tier: the reference executor runs the real signal protocol while a rank
never calls, dies mid-collective, is too slow for the timeout or calls with another size; every
surviving rank must end with the right error within the bound, and every test is bounded itself
(spawn kills what is still alive). The watchdog's logic, the awaited-peer arithmetic and the
handle's failure semantics, with no process: tests/unit/test_watchdog.py.
"""
from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from conccl.errors import CollectiveError, CollectiveTimeout, GroupBroken  # noqa: E402
from conccl.testing import spawn  # noqa: E402


def _call(comm, n=16, timeout=None, value=None):
    r = comm.rank
    out = torch.full((comm.world * n,), -1.0)
    comm.all_gather_into_tensor(out, torch.full((n,), float(r if value is None else value)),
                                timeout=timeout)
    return out


def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except CollectiveError as e:
        return e, time.monotonic() - t0
    return None, time.monotonic() - t0


def _never_calls(comm, timeout_s):
    _call(comm)  # the group works
    if comm.rank == 1:
        time.sleep(timeout_s + 1.0)  # never calls within the others' timeout, then comes late
        late, took = _timed(lambda: _call(comm))
        return type(late).__name__, round(took, 2), str(late)
    err, took = _timed(lambda: _call(comm, timeout=timedelta(seconds=timeout_s)))
    again, took_again = _timed(lambda: _call(comm))
    return (type(err).__name__, err.missing, err.seq, round(took, 2), type(again).__name__, round(took_again, 3),
            str(again))


def test_a_rank_that_never_calls():
    timeout_s = 0.5
    results = spawn(3, _never_calls, timeout_s, join_timeout_s=30)
    for r in (0, 2):
        kind, missing, seq, took, again, took_again, again_msg = results[r]
        assert kind == "CollectiveTimeout" and missing == [1] and seq == 2
        assert took <= timeout_s + 1.0
        # the group is broken: the next call fails at once, with the original cause
        assert again == "GroupBroken" and took_again < 0.1 and "waiting for rank(s) 1" in again_msg
    kind, took, msg = results[1]
    assert kind == "GroupBroken" and took < 0.1 and "broke the group at sequence number 2" in msg


def _killed_mid_collective(comm, victim, timeout_s):
    _call(comm)
    if comm.rank == victim:
        # Die after the host handshake, before this rank's part of the transfers: the others
        # are left waiting for a READY that never comes.
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        comm.executor.run = die
        _call(comm)
        return "survived?"
    err, took = _timed(lambda: _call(comm, timeout=timedelta(seconds=timeout_s)))
    return type(err).__name__, err.missing, getattr(err, "exited", None), round(took, 2)


@pytest.mark.parametrize("timeout_s", [2.0, 60.0])
def test_a_rank_killed_mid_collective(timeout_s):
    results = spawn(4, _killed_mid_collective, 2, timeout_s, join_timeout_s=30, allow_missing=(2,))
    assert results[2] is None
    for r in (0, 1, 3):
        kind, missing, exited, took = results[r]
        assert kind == "CollectiveTimeout" and missing == [2] and exited == [2]
        # a dead process is noticed without waiting for the timeout (liveness is polled every 0.1 s)
        assert took <= min(timeout_s, 1.0) + 1.0


def _slower_than_timeout(comm, timeout_s):
    _call(comm)
    if comm.rank == 0:
        run = comm.executor.run

        def slow_run(*args, **kwargs):
            time.sleep(timeout_s + 0.7)  # the collective takes longer than its timeout
            return run(*args, **kwargs)

        comm.executor.run = slow_run
    err, took = _timed(lambda: _call(comm, timeout=timedelta(seconds=timeout_s)))
    return type(err).__name__, err.missing, round(took, 2), str(err)


def test_a_timeout_shorter_than_the_collective():
    timeout_s = 0.3
    results = spawn(3, _slower_than_timeout, timeout_s, join_timeout_s=30)
    for r in (1, 2):
        kind, missing, took, _ = results[r]
        assert kind == "CollectiveTimeout" and missing == [0] and took <= timeout_s + 1.0
    # The slow rank gets its peers' data (they staged it before giving up) but must not pass it
    # off as valid: it learns that the group gave up on this call, and why.
    kind, missing, took, msg = results[0]
    assert kind == "GroupBroken" and missing == [0] and "waiting for rank(s) 0" in msg
    assert took <= timeout_s + 0.7 + 1.0


def _mismatch_then_recover(comm):
    n = 8 if comm.rank != 1 else 9
    out = torch.full((comm.world * n,), 3.0)
    err, _ = _timed(lambda: comm.all_gather_into_tensor(out, torch.zeros(n)))
    dtype = torch.float16 if comm.rank == 2 else torch.float32
    out2 = torch.full((comm.world * 4,), 5.0, dtype=dtype)
    err2, _ = _timed(lambda: comm.all_gather_into_tensor(out2, torch.zeros(4, dtype=dtype)))
    good = _call(comm)  # a mismatch is refused on every rank alike: the group stays usable
    expected = torch.arange(comm.world, dtype=torch.float32).repeat_interleave(16)
    return (str(err), bool((out == 3.0).all()), str(err2), bool((out2 == 5.0).all()),
            bool(torch.equal(good, expected)))


def test_mismatched_size_or_dtype_raises_everywhere_moves_nothing_and_leaves_the_group_usable():
    for msg, untouched, msg2, untouched2, good in spawn(3, _mismatch_then_recover, join_timeout_s=30):
        assert "rank 1" in msg and "nothing was moved" in msg and untouched
        assert "dtype" in msg2 and "torch.float16" in msg2 and untouched2
        assert good
