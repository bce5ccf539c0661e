"""CPU tier: a settled eager pipeline (a conccl.tp call) launched as one graph, with stand-in
streams, events, programs and graphs (conccl.executors.cuda.settled_pipeline): when a graph
is made (the GRAPH_AFTER-th call with the same GEMM-step buffers), that it is kept per buffer
set, the order its capture queues the slots in (the eager fork and join), and that a capture
that fails leaves the calls on driver calls for good. tests/gpu/test_gpu_tp.py runs it on
GPUs against NCCL; tests/unit/test_settled_graph.py the graph itself against a fake driver."""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from conccl.executors.cuda import executor as cuda_ce
from conccl.executors.cuda import graph_launch as sg
from conccl.executors.cuda import programs
from conccl.executors.cuda import settled_pipeline as sp
from conccl.executors.cuda.lowering import ComputeStep, CopyStep, SignalBatch, SignalStep

_REAL_SETTLED_GRAPH = sg.SettledGraph
_NO_GEMM = lambda: None  # noqa: E731 - the GEMM steps as a capture would make them (unused by stand-ins)

GEMM = ComputeStep(object())
LOWERED = ((SignalBatch((SignalStep(False, 0x204, 0),)),),
           (SignalBatch((SignalStep(True, 0x100, 0),)), CopyStep(1, 2, 64)),
           (GEMM, SignalBatch((SignalStep(False, 0x300, 0),))))


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


class _Program:
    def __init__(self, lowered, log):
        # compiled calls, not the lowered steps (as CompiledProgram's slots)
        self.slots, self._lowered, self.log = [("compiled", len(s)) for s in lowered], lowered, log

    def launch_slot(self, k, stream, seq, compute=None):
        self.log.append(("launch", k, stream, seq))
        for step in self._lowered[k]:
            if isinstance(step, ComputeStep):
                compute(step.op)


class _Pool:
    id = (7, 7)


class _Device:  # torch.cuda.device without a GPU: a class still, which torch's isinstance checks need
    def __init__(self, index):
        self.index = index

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Graph:
    made: list = []

    def __init__(self, program, steps, capture_stream, cu, queue=None, capture=None):
        self.steps, self.closed, self.capture = steps, False, capture
        queue(capture_stream, 0x5EED0000)
        _Graph.made.append(self)

    def close(self):
        self.closed = True


@pytest.fixture
def executor(monkeypatch):
    log = []
    names = iter(range(1000))
    # the whole program's slots, one per stream (test_marks_become_edges... takes the segments)
    monkeypatch.setenv("CONCCL_DISABLE", "graph_mark_edges")
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: _Event(f"e{next(names)}", log))
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device=None: _Stream(handle, log), raising=False)
    monkeypatch.setattr(sp, "lower", lambda *a, **k: LOWERED)
    monkeypatch.setattr(programs, "buffer_addresses", lambda *a: None)
    monkeypatch.setattr(sp, "CompiledProgram", lambda lowered, cu, index: _Program(lowered, log))
    monkeypatch.setattr(sp, "driver", lambda: type("Cu", (), {"CUstream": staticmethod(lambda h: h)}))
    monkeypatch.setattr(torch.cuda, "MemPool", lambda: _Pool())
    handles = iter(range(200, 300))
    monkeypatch.setattr(sg, "create_stream", lambda: next(handles))  # raw streams of the executor's own
    monkeypatch.setattr(torch.cuda, "device", _Device)
    monkeypatch.setattr(sg, "available", lambda: True)
    monkeypatch.setattr(sg, "SettledGraph", _Graph)
    _Graph.made = []
    ex = object.__new__(cuda_ce.CudaCopyEngineExecutor)
    ex.rank, ex._pads, ex.batching, ex._marks, ex._spin_words, ex._device_index = 0, [0, 0], "all", 0, 0, 0
    ex.device, ex._capture_stream, ex._pipeline_pool, ex._pipeline_streams = None, 0x51, None, None
    ex._pipeline_graphs_off, ex._graph_keep = False, []
    ex._streams = [_Stream(100 + k, log) for k in range(4)]  # the eager slots' (never captured on)
    ex._cu_stream = lambda s: s.cuda_stream
    ex._on = lambda stream, compute: (lambda op: log.append(("gemm", stream.cuda_stream)))
    ex.programs_graphed = ex.pipelines_graphed = ex.graph_failures = 0
    ex.program_compile_s = 0.0
    return ex, log


class _Schedule:
    collective = "reduce_scatter"
    slots = ()


def _entry():
    return programs.CachedProgram(_Schedule(), None, None, None, LOWERED)


def test_the_third_call_with_the_same_buffers_is_captured_and_later_ones_reuse_it(executor):
    ex, log = executor
    entry = _entry()
    call = [ex._settled_pipeline(entry, ("a", "w"), _NO_GEMM, None, None, None) for _ in range(4)]
    assert call[:2] == [None, None] and call[2] is call[3] is _Graph.made[0]
    assert ex.pipelines_graphed == ex.programs_graphed == 1 and len(_Graph.made) == 1
    # the graph is checked against the lowered steps of every slot (not the compiled calls)
    assert _Graph.made[0].steps == tuple(step for slot in LOWERED for step in slot)
    # captured by PyTorch into one pool the executor keeps (the GEMMs' cuBLAS workspace lives there)
    assert isinstance(_Graph.made[0].capture, sp.TorchCapture) and _Graph.made[0].capture.pool is ex._pipeline_pool
    # other buffers (a new weight, another activation): counted, and captured, on their own
    other = [ex._settled_pipeline(entry, ("b", "w"), _NO_GEMM, None, None, None) for _ in range(3)]
    assert other[:2] == [None, None] and other[2] is _Graph.made[1]
    assert ex._settled_pipeline(entry, ("a", "w"), _NO_GEMM, None, None, None) is call[2]


def test_the_capture_forks_every_slot_from_the_capture_stream_and_joins_it_back(executor):
    ex, log = executor
    entry = _entry()
    for _ in range(3):
        ex._settled_pipeline(entry, ("a",), _NO_GEMM, None, None, None)
    # the fork first, recorded on the capture stream before the control slot is queued there:
    # the control slot waits for the peers' signals of this call, which they send once the
    # other slots' copies have run (forked after it, a push pipeline hung on GPUs)
    fork = log[0]
    assert fork[0] == "record" and fork[2] == 0x51
    assert log[1] == ("launch", 0, 0x51, 0x5EED0000)
    side = {k: ex._pipeline_streams[k].cuda_stream for k in (1, 2)}
    # raw streams of the executor's own (create_stream), only captures use: not the eager slots'
    # nor PyTorch's pooled ones, which other work shares
    assert all(h >= 200 for h in side.values()) and not set(side.values()) & {s.cuda_stream for s in ex._streams}
    for k in (1, 2):
        h = side[k]
        mine = [i for i, e in enumerate(log) if e[1:2] == (h,) or (e[0] == "launch" and e[1] == k)
                or (e[0] == "record" and e[2] == h)]
        kinds = [log[i] for i in mine]
        assert kinds[0] == ("wait", h, fork[1])  # the fork before anything on the side stream
        assert kinds[1] == ("launch", k, h, 0x5EED0000)
        join = kinds[-1]
        assert join[0] == "record" and join[2] == h
        assert ("wait", 0x51, join[1]) in log[mine[-1]:]  # joined back into the capture stream
    assert ("gemm", side[2]) in log  # the GEMM step ran on its slot's capture stream


def test_a_failed_capture_leaves_driver_calls_for_good_and_warns_once(executor, monkeypatch):
    ex, _ = executor

    def failing(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(sg, "SettledGraph", failing)
    entry = _entry()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [ex._settled_pipeline(entry, ("a",), _NO_GEMM, None, None, None) for _ in range(5)]
    assert got == [None, None, False, False, False] and ex.graph_failures == 1
    assert len([w for w in seen if "stay driver calls" in str(w.message)]) == 1
    # and none is tried again on this executor, for other buffers either
    another = _entry()
    other = [ex._settled_pipeline(another, ("b",), _NO_GEMM, None, None, None) for _ in range(3)]
    assert other == [None, None, False] and ex.graph_failures == 1


def test_a_program_without_a_graphable_pipeline_gets_none(executor):
    ex, _ = executor
    entry = programs.CachedProgram(_Schedule(), None, None, None, (LOWERED[0], LOWERED[1]))  # no GEMM step
    got = [ex._settled_pipeline(entry, ("a",), _NO_GEMM, None, None, None) for _ in range(4)]
    assert got == [None, None, False, False] and _Graph.made == []


def test_many_buffer_sets_drop_the_least_recently_used_only(executor):
    ex, _ = executor
    entry = _entry()
    for i in range(sp.MAX_PIPELINE_GRAPHS):
        for _ in range(3):
            ex._settled_pipeline(entry, (i,), _NO_GEMM, None, None, None)
    assert len(_Graph.made) == sp.MAX_PIPELINE_GRAPHS and not any(g.closed for g in _Graph.made)
    first = _Graph.made[0]
    assert ex._settled_pipeline(entry, (0,), _NO_GEMM, None, None, None) is first  # set 0 used again
    ex._settled_pipeline(entry, ("one more",), _NO_GEMM, None, None, None)
    closed = [g for g in _Graph.made if g.closed]
    assert closed == [_Graph.made[1]]  # set 1, now the least recently used; set 0 kept
    assert (0,) in entry.pipelines and (1,) not in entry.pipelines and len(entry.pipelines) == sp.MAX_PIPELINE_GRAPHS


def test_a_capture_failing_midway_joins_its_streams_and_ends_the_pools_routing(executor, monkeypatch):
    """The real SettledGraph over a fake driver and a fake PyTorch CUDAGraph: a GEMM step that
    raises under the capture still gets its side stream joined back before the capture ends, a
    capture_end that raises hands the pool's routing back (``_cuda_endAllocateToPool``), and the
    executor keeps driver calls from then on."""
    monkeypatch.setattr(sg, "SettledGraph", _REAL_SETTLED_GRAPH)
    monkeypatch.setattr(sg, "_api", lambda: {"cuGraphExecBatchMemOpNodeSetParams": None, "cuGraphLaunch": None})
    ex, log = executor
    ended = []
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", lambda dev, pool: ended.append((dev, pool)))

    class FakeCUDAGraph:
        def __init__(self, keep_graph=False):
            assert keep_graph

        def capture_begin(self, pool=None, capture_error_mode="global"):
            log.append(("capture_begin", pool, capture_error_mode))

        def capture_end(self):
            log.append(("capture_end",))
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)

    def failing_gemm(stream, compute):
        def run(op):
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
        return run

    ex._on = failing_gemm
    entry = _entry()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = [ex._settled_pipeline(entry, ("a",), _NO_GEMM, None, None, None) for _ in range(3)]
    assert got == [None, None, False] and ex._pipeline_graphs_off, [str(w.message) for w in seen]
    assert ex._capture_stream is None  # may still be capturing: the flat graphs get a new one
    assert ("capture_begin", (7, 7), "thread_local") in log, [str(w.message) for w in seen]
    gemm_slot = ex._pipeline_streams[2].cuda_stream
    join = next(e for e in log if e[0] == "record" and e[2] == gemm_slot)
    assert log.index(("wait", 0x51, join[1])) < log.index(("capture_end",))  # joined before the end
    assert ended == [(0, (7, 7))]
    assert any(isinstance(g, FakeCUDAGraph) for g in ex._graph_keep)  # kept: PyTorch may refer to it
    assert any("CUBLAS_STATUS_NOT_SUPPORTED" in str(w.message) or "capturing" in str(w.message) for w in seen)


def test_a_pipeline_copying_within_its_gpu_keeps_driver_calls(executor):
    """A pull pipeline's staging of a plain input (a same-GPU copy) ran as an SM kernel in a
    graph: such a pipeline is never graphed; a push pipeline and a GEMM+reduce-scatter are."""
    from conccl.collectives.all_gather import plan_all_gather
    from conccl.collectives.reduce_scatter import plan_reduce_scatter
    from conccl.schedule.pipeline import TPSchedule, gather_then_gemm, gemm_then_scatter

    def pipeline(name, op):
        tp = TPSchedule.parse(name)
        if op == "ag":
            flat = plan_all_gather(2, 0, 4096, algorithm=tp.flat_algorithm(), stream_mode=tp.stream_mode())
            return gather_then_gemm(flat, tp, 16, 256, keep_own=False)
        flat = plan_reduce_scatter(2, 0, 4096, "bfloat16", stream_mode=tp.stream_mode())
        return gemm_then_scatter(flat, tp, 16, 256)

    assert sg.same_gpu_copies(pipeline("direct", "ag"))  # stages the plain shard
    assert not sg.same_gpu_copies(pipeline("push-s2", "ag"))
    assert not sg.same_gpu_copies(pipeline("direct", "rs")) and not sg.same_gpu_copies(pipeline("direct-p2-s2", "rs"))
    ex, _ = executor
    staged = programs.CachedProgram(pipeline("direct", "ag"), None, None, None, LOWERED)
    assert [ex._settled_pipeline(staged, ("a",), _NO_GEMM, None, None, None) for _ in range(4)] == [None, None, False, False]
    pushed = programs.CachedProgram(pipeline("push-s2", "ag"), None, None, None, LOWERED)
    assert [ex._settled_pipeline(pushed, ("a",), _NO_GEMM, None, None, None) for _ in range(3)][2] is _Graph.made[-1]


class _FakeCUDAGraph:
    fail_at = None

    def __init__(self, keep_graph=False):
        assert keep_graph  # the graph is kept: its nodes are read and its exec launched by conccl
        self.calls = []

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.calls.append(("capture_begin", pool, capture_error_mode, torch.cuda.current_stream()))
        if self.fail_at == "begin":
            raise RuntimeError("capture_begin failed")

    def capture_end(self):
        self.calls.append(("capture_end", torch.cuda.current_stream()))
        if self.fail_at == "end":
            raise RuntimeError("capture_end failed")

    def raw_cuda_graph(self):
        self.calls.append("raw_cuda_graph")
        return 0x6A

    def instantiate(self):
        self.calls.append("instantiate")

    def raw_cuda_graph_exec(self):
        assert "instantiate" in self.calls
        return 0xE7


@pytest.mark.parametrize("fail_at", [None, "begin", "end"])
def test_torch_capture_begins_and_ends_on_the_capture_stream_and_abandons_a_failed_graph(monkeypatch, fail_at):
    current = ["default"]

    @contextlib.contextmanager
    def on(stream):
        before, current[0] = current[0], stream
        try:
            yield
        finally:
            current[0] = before

    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: current[0])
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device=None: ("stream", handle, device), raising=False)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeCUDAGraph)
    monkeypatch.setattr(_FakeCUDAGraph, "fail_at", fail_at)
    ended = []
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", lambda dev, pool: ended.append((dev, pool)))
    keep = []
    capture = sp.TorchCapture(_Pool(), 3, keep)
    if fail_at == "begin":
        with pytest.raises(RuntimeError, match="capture_begin failed"):
            capture.begin(0x51)
    else:
        capture.begin(0x51)
        graph = capture.graph
        if fail_at == "end":
            with pytest.raises(RuntimeError, match="capture_end failed"):
                capture.end()
        else:
            assert capture.end() == 0x6A and capture.instantiate() == 0xE7
            assert graph.calls[0] == ("capture_begin", (7, 7), "thread_local", ("stream", 0x51, 3))
            assert graph.calls[1] == ("capture_end", ("stream", 0x51, 3))  # on the stream it began on
            capture.close()
            assert capture.graph is None and keep == [] and ended == []
            return
    # a failed capture: the pool's routing ended, the graph kept alive (PyTorch may refer to it)
    assert ended == [(3, (7, 7))] and len(keep) == 1 and isinstance(keep[0], _FakeCUDAGraph)
    assert capture.graph is None and current[0] == "default"


def test_marks_become_edges_of_the_graph_and_no_memory_operation_is_left_for_them(executor, monkeypatch):
    """With mark edges on (the default), a settled GEMM+reduce-scatter is captured segment by
    segment (conccl.schedule.captured.mark_edges): no segment lowers a mark that is an edge, every edge's
    event is recorded on its writer's stream before its awaiter's stream waits on it, and every
    side stream is forked from the capture stream first and joined back."""
    from conccl.collectives.reduce_scatter import plan_reduce_scatter
    from conccl.schedule.captured import mark_edges
    from conccl.schedule.pipeline import TPSchedule, gemm_then_scatter
    from conccl.schedule.base import AwaitMark, Compute, Mark

    monkeypatch.setenv("CONCCL_DISABLE", "")
    ex, log = executor
    lowered_ops = []

    def lower(schedule, *a, **k):  # each op a step of its own: a GEMM step runs compute(op)
        assert len(schedule.slots) == 1  # one segment at a time
        lowered_ops.extend(schedule.slots[0])
        return (tuple(ComputeStep(op) if isinstance(op, Compute) else SignalBatch((SignalStep(False, 0x10, 0),))
                      for op in schedule.slots[0]),)

    monkeypatch.setattr(sp, "lower", lower)
    schedule = gemm_then_scatter(plan_reduce_scatter(2, 0, 4096, "bfloat16", stream_mode=TPSchedule.parse("direct-s2")
                                                     .stream_mode()), TPSchedule.parse("direct-s2"), 16, 256)
    writes = [op.word for ops in schedule.slots for op in ops if isinstance(op, Mark)]
    edges = {op.word for ops in schedule.slots for op in ops if isinstance(op, AwaitMark) and writes.count(op.word) == 1}
    assert edges, "a pipeline with no mark to turn into an edge tests nothing here"
    entry = programs.CachedProgram(schedule, None, None, None, LOWERED)
    got = [ex._settled_pipeline(entry, ("a",), _NO_GEMM, None, None, None) for _ in range(3)]
    assert got[2] is _Graph.made[-1]
    assert not [op for op in lowered_ops if isinstance(op, (Mark, AwaitMark)) and op.word in edges]
    assert sum(isinstance(op, Compute) for op in lowered_ops) == sum(
        isinstance(op, Compute) for ops in schedule.slots for op in ops)  # every GEMM step captured once
    assert len(_Graph.made[-1].steps) == len(lowered_ops)
    assert sum(isinstance(step, ComputeStep) for step in _Graph.made[-1].steps) == sum(
        isinstance(op, Compute) for op in lowered_ops)
    segments = mark_edges(schedule)
    launches = [i for i, e in enumerate(log) if e[0] == "launch"]
    assert len(launches) == len(segments)
    recorded = {}  # event name -> (stream, log index)
    for i, e in enumerate(log):
        if e[0] == "record":
            recorded[e[1]] = (e[2], i)
    waits = [(i, e) for i, e in enumerate(log) if e[0] == "wait"]
    fork = log[0]
    assert fork[0] == "record" and fork[2] == 0x51
    for i, (_, stream, event) in waits:
        assert event in recorded and recorded[event][1] < i  # recorded before any wait on it
    side = {e[1] for _, e in waits if e[1] != 0x51}
    assert side and all(h >= 200 for h in side)
    for h in side:
        first = next(e for e in log if (e[0] == "wait" and e[1] == h) or (e[0] == "launch" and e[2] == h))
        assert first == ("wait", h, fork[1])  # forked before anything on it
        last_record = max(i for i, e in enumerate(log) if e[0] == "record" and e[2] == h)
        assert ("wait", 0x51, log[last_record][1]) in log[last_record:]  # joined back
    edge_waits = sum(len(seg.waits) for seg in segments)
    assert edge_waits and len(waits) == 2 * len(side) + edge_waits  # a fork and a join per side stream, else edges
