"""CPU tier: the order the CUDA executor keeps between a group's calls when some are routed to
the fallback backend (CudaCopyEngineExecutor.run_fallback, _control_stream), with stand-in
streams and events: a blocking routed call records no event, and a later call on another
stream waits for an event recorded then on the routed call's stream."""
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
    ex._last_end = ex._last_stream = ex._unmarked = None
    ex._current_stream = lambda: current[0]
    return ex


def test_a_routed_call_is_marked_only_when_a_later_call_runs_on_another_stream():
    log = []
    a, b = _Stream(1, log), _Stream(2, log)
    current = [a]
    ex = _executor(log, current)
    calls = []
    for _ in range(3):  # blocking routed calls back to back on one stream: no event, no wait
        ex.run_fallback(lambda: calls.append("nccl"), False, ())
    assert calls == ["nccl"] * 3 and log == [] and ex._unmarked is a
    assert ex._control_stream(a, False) is a and log == []  # our next call on that stream: stream order
    ex.run_fallback(lambda: None, False, ())
    # our next call on another stream: the routed call's stream is marked now, and waited for
    assert ex._control_stream(b, False) is b
    assert log == [("record", "end_mark", 1), ("wait", 2, "end_mark")] and ex._unmarked is None
    assert (ex._last_end.name, ex._last_stream) == ("end_mark", 1)


def test_a_routed_call_waits_for_our_earlier_call_and_keeps_it_for_close():
    log = []
    a, b = _Stream(1, log), _Stream(2, log)
    ex = _executor(log, [a])
    earlier = _Event("earlier_end", log)
    ex._last_end, ex._last_stream = earlier, b.cuda_stream  # a call of ours ended on stream 2
    ex.run_fallback(lambda: None, False, ())
    assert log == [("wait", 1, "earlier_end")]  # the routed call follows it
    assert ex._last_end is earlier  # close() still sees our own last call's end
    log.clear()
    # an async call of ours after it: the group stream waits for the caller's mark, recorded
    # after the routed call on that very stream (which followed the earlier call): nothing more
    assert ex._control_stream(a, True).cuda_stream == 99
    assert log == [("record", "caller_mark", 1), ("wait", 99, "caller_mark")]


def test_without_the_lazy_mark_the_later_call_would_not_wait():
    # the counter-case: a later call on another stream with the routed call forgotten waits for
    # nothing (which is what the mark prevents)
    log = []
    a, b = _Stream(1, log), _Stream(2, log)
    ex = _executor(log, [a])
    ex.run_fallback(lambda: None, False, ())
    ex._unmarked = None
    ex._control_stream(b, False)
    assert log == []
