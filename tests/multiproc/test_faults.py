"""A late, dead or mismatched peer never hangs or corrupts a collective.

No-device tier: the watchdog's logic with stand-in events, the awaited-peer arithmetic, the
handle's failure semantics. CPU multi-process tier: the reference executor runs the real
signal protocol while a rank never calls, dies mid-collective, is too slow for the timeout or
calls with another size; every surviving rank must end with the right error within the
bound, and every test is bounded itself (spawn kills what is still alive).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from conccl.collectives.all_gather import plan_all_gather  # noqa: E402
from conccl.errors import CollectiveError, CollectiveTimeout, GroupBroken  # noqa: E402
from conccl.testing import spawn  # noqa: E402
from conccl.schedule.base import Algorithm, Signal, StreamMode, awaited_peers, signal_pad_words, signal_word  # noqa: E402
from conccl.group.watchdog import Flight, Watchdog  # noqa: E402
from conccl.group.work import Work  # noqa: E402


class FakeEvent:
    def __init__(self, done=False):
        self.done = done

    def query(self):
        return self.done


# ---------------------------------------------------------------------------- no device
def _watchdog(timeout_verdict_after=None):
    calls = {"judged": [], "failed": []}

    def judge(flight, running_s):
        calls["judged"].append((flight.seq, running_s))
        if timeout_verdict_after is not None and running_s > flight.timeout_s:
            return CollectiveTimeout(flight.what, flight.seq, [2], running_s)
        return None

    wd = None

    def fail(error):
        calls["failed"].append(error)
        calls["drained"] = wd.drain(error)

    wd = Watchdog(judge, fail, start=False)  # the test drives poll() itself, with its own clock
    return wd, calls


def test_watchdog_clock_starts_when_the_call_starts_on_the_gpu():
    wd, calls = _watchdog(timeout_verdict_after=True)
    f = Flight(1, "conccl all_gather", 1.0, FakeEvent(False), FakeEvent(False))
    wd.track(f)
    assert wd.poll(now=100.0) is None and calls["judged"] == []  # queued behind the caller's work
    f.start.done = True
    assert wd.poll(now=200.0) is None and f.started_at == 200.0
    assert wd.poll(now=200.9) is None and f.error is None
    error = wd.poll(now=201.2)
    assert isinstance(error, CollectiveTimeout) and f.error is error and calls["drained"] == [f]
    assert wd.in_flight() == 0
    wd.close()


def test_watchdog_fails_every_flight_behind_the_stuck_one_and_forgets_finished_ones():
    wd, calls = _watchdog(timeout_verdict_after=True)
    finished = [Flight(k, "x", 1.0, FakeEvent(True), FakeEvent(True)) for k in range(1, 10001)]
    for f in finished:
        wd.track(f)
    stuck = Flight(10001, "x", 1.0, FakeEvent(True), FakeEvent(False))
    behind = Flight(10002, "x", 1.0, FakeEvent(False), FakeEvent(False))
    wd.track(stuck)
    wd.track(behind)
    wd.poll(now=0.0)
    assert wd.in_flight() == 2  # 10,000 finished calls leave nothing behind
    assert calls["judged"] == [(10001, 0.0)]
    wd.poll(now=1.5)
    assert stuck.error is behind.error is calls["failed"][0] and all(f.error is None for f in finished)
    wd.close()


def test_watchdog_thread_detects_within_the_bound():
    fired = threading.Event()
    wd = None

    def judge(flight, running_s):
        return CollectiveTimeout(flight.what, flight.seq, [1], running_s) if running_s > flight.timeout_s else None

    def fail(error):
        wd.drain(error)
        fired.set()

    wd = Watchdog(judge, fail, poll_s=0.05)
    t0 = time.monotonic()
    f = Flight(7, "conccl all_to_all", 0.3, FakeEvent(True), FakeEvent(False))
    wd.track(f)
    assert fired.wait(5.0)
    took = time.monotonic() - t0
    assert 0.3 <= took <= 0.3 + 1.0 and f.error.seq == 7 and f.error.missing == [1]
    wd.close()


def test_a_failed_handle_raises_instead_of_handing_out_the_output():
    f = Flight(3, "conccl all_gather", 1.0, FakeEvent(True), FakeEvent(False))
    work = Work(FakeEvent(False), None, f)
    assert not work.is_completed() and work.exception() is None
    with pytest.raises(CollectiveTimeout):
        work.synchronize(timeout=0.05)  # its own bound, the group's not reached
    f.error = CollectiveTimeout("conccl all_gather", 3, [2], 9.0)
    assert work.is_completed() and work.exception() is f.error
    for method in (work.wait, work.synchronize):
        with pytest.raises(CollectiveTimeout, match="rank\\(s\\) 2"):
            method()


def test_awaited_peers_compares_as_the_gpu_does():
    world, seq = 4, 5
    sched = plan_all_gather(world, 1, 64, algorithm=Algorithm.PULL, stream_mode=StreamMode.SINGLE,
                            input_symmetric=False, output_symmetric=False, in_place=False, peers_in_place=False)
    pad = [0] * signal_pad_words(world)
    for p in range(world):
        pad[signal_word(Signal.READY, p, world)] = seq
        pad[signal_word(Signal.DONE, p, world)] = seq - 1
    assert awaited_peers(sched, seq, pad, world) == []
    pad[signal_word(Signal.READY, 3, world)] = seq - 1
    pad[signal_word(Signal.DONE, 2, world)] = seq - 2  # the staged workspace is still being read
    assert awaited_peers(sched, seq, pad, world) == [2, 3]
    # sequence numbers wrap around 2^32 as the 32-bit words do
    wrap = (1 << 32) - 1
    pad = [wrap] * signal_pad_words(world)
    assert awaited_peers(sched, wrap, pad, world) == []
    assert awaited_peers(sched, wrap + 2, pad, world) == [0, 2, 3]


def test_error_types_are_torch_distributed_errors_and_pickle():
    import pickle

    e = CollectiveTimeout("conccl all_gather", 4, [1, 3], 2.5, exited=[3], note="rank 0 gave up")
    assert isinstance(e, torch.distributed.DistError) and isinstance(e, CollectiveError)
    assert "rank(s) 1, 3" in str(e) and "rank(s) 3 has exited" in str(e) and "gave up" in str(e)
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.seq, e2.missing, e2.exited, str(e2)) == (4, [1, 3], [3], str(e))
    assert issubclass(GroupBroken, CollectiveError)


# ---------------------------------------------------------------------------- CPU processes
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


def test_a_peer_abort_fails_a_finished_call_but_leaves_a_running_one_to_the_watchdog():
    verdict = GroupBroken("rank 0 broke the group at sequence number 4: ...")
    running = Flight(4, "x", 1.0, FakeEvent(True), FakeEvent(False), late_verdict=lambda seq: verdict)
    assert running.failure() is None and not running.done()  # the watchdog still owns it
    running.end.done = True
    assert running.failure() is verdict  # finished after a peer gave up on it: not valid
    older = Flight(3, "x", 1.0, FakeEvent(True), FakeEvent(True), late_verdict=lambda seq: None)
    assert older.failure() is None
