"""CPU tier: the order the CUDA executor keeps between a group's calls when some are routed to
the fallback backend (CudaCopyEngineExecutor.run_fallback, _control_stream), with stand-in
streams and events: a routed call follows the group's earlier calls and marks its own end at
once, so a later call on another stream waits for it and for nothing queued after it.
(Marking lazily, when a later call needed it, was tried in session 11 and dropped: it made that
call wait for whatever the caller queued meanwhile, and a failing routed call lost the mark.)"""
from __future__ import annotations

from conccl.executors.cuda_ce import CudaCopyEngineExecutor


class _Stream:
    def __init__(self, handle, log):
        self.cuda_stream, self.log = handle, log

    def wait_event(self, event):
        self.log.append(("wait", self.cuda_stream, event.name))


class _Event:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def record(self, stream):
        self.log.append(("record", self.name, stream.cuda_stream))


def _executor(log, current):
    ex = object.__new__(CudaCopyEngineExecutor)  # the ordering state only: no device
    ex._streams = [_Stream(99, log)]
    ex._caller_mark, ex._end_mark = _Event("caller_mark", log), _Event("end_mark", log)
    ex._last_end = ex._last_stream = None
    ex._current_stream = lambda: current[0]
    return ex


def test_a_blocking_routed_call_marks_its_end_on_its_stream_at_once():
    log = []
    a, b = _Stream(1, log), _Stream(2, log)
    ex = _executor(log, [a])
    ran = []
    ex.run_fallback(lambda: ran.append(log[:]), False, ())
    assert ran == [[]]  # nothing to wait for before it
    assert log == [("record", "end_mark", 1)] and (ex._last_end.name, ex._last_stream) == ("end_mark", 1)
    log.clear()
    assert ex._control_stream(a, False) is a and log == []  # the next call on that stream: stream order
    assert ex._control_stream(b, False) is b and log == [("wait", 2, "end_mark")]  # on another: waits


def test_a_routed_call_follows_our_earlier_call_on_another_stream():
    log = []
    a, b = _Stream(1, log), _Stream(2, log)
    ex = _executor(log, [a])
    ex._last_end, ex._last_stream = _Event("earlier_end", log), b.cuda_stream  # a call of ours ended on 2
    seen = []
    ex.run_fallback(lambda: seen.extend(log), False, ())
    assert seen == [("wait", 1, "earlier_end")]  # waited for before the backend's call was queued
    assert log[-1] == ("record", "end_mark", 1)


def test_a_failing_routed_call_leaves_the_group_order_as_it_was():
    log = []
    a, b = _Stream(1, log), _Stream(2, log)
    ex = _executor(log, [a])
    ex.run_fallback(lambda: None, False, ())  # a routed call on stream 1
    log.clear()

    def fails():
        raise RuntimeError("the backend refused the arguments")
    try:
        ex.run_fallback(fails, False, ())
    except RuntimeError:
        pass
    assert (ex._last_end.name, ex._last_stream) == ("end_mark", 1)  # the first call's mark still stands
    ex._control_stream(b, False)
    assert log[-1] == ("wait", 2, "end_mark")
