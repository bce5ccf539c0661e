"""CPU tier: the order the CUDA executor keeps, with stand-in streams and events: between a
captured pipeline's streams when its marks are graph edges (_capture_with_edges, last test),
and between a group's calls when some are routed to the fallback backend
(CudaCopyEngineExecutor.run_fallback, _control_stream): a routed call follows the group's
earlier calls and marks its own end at once, so a later call on another stream waits for it and
for nothing queued after it.
(Marking lazily, when a later call needed it, would make that
call wait for whatever the caller queued meanwhile, and a failing routed call would lose the mark.)"""
from __future__ import annotations

from conccl.executors.cuda.executor import CudaCopyEngineExecutor


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


def test_a_captured_pipeline_with_edges_forks_records_before_waits_and_joins(monkeypatch):
    """CudaCopyEngineExecutor._capture_with_edges with stand-in streams, events and programs: each
    side stream waits for the fork before anything, each segment waits for the events of the
    marks it awaits (recorded, after their writer's launch, earlier in the host's order) and
    records its own after its launch, and every side stream is joined back into the caller's."""
    import torch

    from conccl.collectives.reduce_scatter import plan_reduce_scatter
    from conccl.executors.cuda import executor as cuda_ce
    from conccl.schedule.captured import graph_schedule, mark_edges
    from conccl.schedule.pipeline import TPSchedule, gemm_then_scatter
    from conccl.schedule.base import StreamMode

    log = []
    names = iter(range(1000))
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: _Event(f"e{next(names)}", log))
    caller = _Stream(0, log)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: caller)
    ex = object.__new__(CudaCopyEngineExecutor)
    ex._streams = [_Stream(100 + k, log) for k in range(8)]
    ex._cu_streams_pool = [s.cuda_stream for s in ex._streams]
    ex._cu_stream = lambda s: s.cuda_stream
    ex._on = lambda stream, compute: compute
    ex._graph_keep, ex.edge_captures, ex.device = [], 0, None

    class _Program:
        def __init__(self, s):
            self.ops = s.slots[0]

        def launch_slot(self, k, stream, value, compute=None):
            log.append(("launch", stream, self.ops))

    for tp in (TPSchedule(), TPSchedule(pieces=2, gemm_streams=2)):
        log.clear()
        flat = plan_reduce_scatter(2, 0, 4 * 16, "float32", stream_mode=StreamMode.PER_PEER)
        s = graph_schedule(gemm_then_scatter(flat, tp, 4, 16))
        segments = mark_edges(s)
        cuda_ce.CudaCopyEngineExecutor._capture_with_edges(ex, s, _Program, compute=None)
        launches = [e for e in log if e[0] == "launch"]
        assert [e[2] for e in launches] == [seg.ops for seg in segments]  # in mark_edges' order
        handle = {k: (0 if k == 0 else 100 + k) for k in range(len(s.slots))}
        assert [e[1] for e in launches] == [handle[seg.slot] for seg in segments]  # on its slot's stream
        fork = log[0]
        assert fork[0] == "record" and fork[2] == 0  # recorded on the caller first
        recorded = {}  # event -> position
        for i, e in enumerate(log):
            if e[0] == "record":
                recorded[e[1]] = i
            elif e[0] == "wait":
                assert e[2] in recorded and recorded[e[2]] < i  # no wait before its record
        for k in range(1, len(s.slots)):  # a side stream: the fork first, a join recorded and awaited
            mine = [e for e in log if (e[0] == "wait" and e[1] == 100 + k) or (e[0] == "launch" and e[1] == 100 + k)]
            assert mine[0] == ("wait", 100 + k, fork[1])
            join = [e[1] for e in log if e[0] == "record" and e[2] == 100 + k][-1]
            assert ("wait", 0, join) in log[log.index(("record", join, 100 + k)):]
        # each awaited mark: its writer's launch, then its record on the writer's stream, then
        # the awaiter's wait on its stream, then the awaiter's launch
        pos = {id(seg): log.index(launch) for seg, launch in zip(segments, launches)}
        for seg in segments:
            for word in seg.waits:
                writer = next(w for w in segments if word in w.records)
                rec = next(i for i, e in enumerate(log) if e[0] == "record" and i > pos[id(writer)]
                           and e[2] == handle[writer.slot])
                wait = next(i for i, e in enumerate(log) if e[0] == "wait" and e[2] == log[rec][1])
                assert pos[id(writer)] < rec < wait < pos[id(seg)] and log[wait][1] == handle[seg.slot]
        assert ex.edge_captures >= 1
