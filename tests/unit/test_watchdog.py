"""A late, dead or mismatched peer never hangs or corrupts a collective: the parts that need no
process. The watchdog's logic with stand-in events (its clock, the flights behind a stuck one,
its thread's bound), a failed handle, the awaited-peer arithmetic, the error types, a peer's
abort. The same with ranks that never call, die or are too slow: tests/multiproc/test_faults.py.
"""
from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

from conccl.collectives.all_gather import plan_all_gather  # noqa: E402
from conccl.errors import CollectiveError, CollectiveTimeout, GroupBroken  # noqa: E402
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




def test_a_peer_abort_fails_a_finished_call_but_leaves_a_running_one_to_the_watchdog():
    verdict = GroupBroken("rank 0 broke the group at sequence number 4: ...")
    running = Flight(4, "x", 1.0, FakeEvent(True), FakeEvent(False), late_verdict=lambda seq: verdict)
    assert running.failure() is None and not running.done()  # the watchdog still owns it
    running.end.done = True
    assert running.failure() is verdict  # finished after a peer gave up on it: not valid
    older = Flight(3, "x", 1.0, FakeEvent(True), FakeEvent(True), late_verdict=lambda seq: None)
    assert older.failure() is None
