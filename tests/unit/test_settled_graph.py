"""No-device tier: a settled call's graph (conccl.executors.cuda.graph_launch): which programs may
have one, how captured memory-operation nodes are matched to the program's signal batches, and
that each launch writes the call's sequence number into every node before launching, against
a driver API simulated in ctypes memory. The GPU tier (tests/gpu/test_gpu_settled_graph.py)
runs it on devices against NCCL."""
from __future__ import annotations

import ctypes

import pytest

from conccl.executors.cuda import graph_launch as sg
from conccl.executors.cuda.lowering import CopyBatch, CopyStep, OneShotStep, ReduceStep, SignalBatch, SignalStep

W, R = SignalStep(True, 0x100, 0), SignalStep(False, 0x204, 1)


def test_which_programs_may_run_as_a_graph():
    copy = CopyStep(1, 2, 4096)
    assert sg.graphable(((SignalBatch((W,)), copy, SignalBatch((R,))),))
    assert sg.graphable(((SignalBatch((W,)), CopyBatch((copy, copy)), ReduceStep(1, (2, 3), 8, "float32", 1.0)),))
    assert not sg.graphable(((SignalBatch((W,)), copy), (SignalBatch((R,)),)))  # two slots
    assert not sg.graphable(((W, copy, R),))  # single signals: a driver without batches
    assert not sg.graphable(((copy,),))  # no signal: nothing to write per call
    assert not sg.graphable(((SignalBatch((W,)), CopyStep(1, 2, sg.GRAPH_MAX_BYTES + 1)),))
    assert sg.graphable(((SignalBatch((W,)), CopyBatch((CopyStep(1, 2, sg.GRAPH_MAX_BYTES // 2),) * 2)),))
    one_shot = OneShotStep(*([None] * len(OneShotStep._fields)))
    assert not sg.graphable(((one_shot,),))


def test_nodes_are_matched_to_batches_by_their_ops_or_not_at_all():
    a, b = ((True, 1), (False, 2)), ((False, 3),)
    assert sg.match_nodes([b, a], [a, b]) == [1, 0]
    with pytest.raises(ValueError, match="2 memory-operation nodes for 1"):
        sg.match_nodes([a, b], [a])
    with pytest.raises(ValueError, match="matches 2 nodes"):
        sg.match_nodes([a, a], [a, a])
    with pytest.raises(ValueError, match="matches 0 nodes"):
        sg.match_nodes([a, ((True, 9),)], [a, b])


def _v(handle):
    """A handle as the fake sees it: the real functions' argument types turn c_void_p into a pointer."""
    return handle.value if isinstance(handle, ctypes.c_void_p) else handle


class _FakeDriver:
    """The driver functions a settled graph calls, over Python state: a capture records the
    program's signal batches as memory-operation nodes (48-byte ops, as the driver keeps them)."""

    def __init__(self, order=None, corrupt=False, copies=1, kernels=0):
        self.nodes, self.calls, self.order, self.corrupt, self.copies = [], [], order, corrupt, copies
        self.kernels = kernels
        self.capturing = False

    def record_batch(self, signals, seq):  # the fake program's launch during capture
        raw = (ctypes.c_char * (48 * len(signals)))()
        for i, s in enumerate(signals):
            ctypes.c_uint32.from_buffer(raw, 48 * i).value = 1 if s.is_wait else 2
            ctypes.c_uint64.from_buffer(raw, 48 * i + 8).value = s.address
            value = (seq + s.seq_delta + (1 if self.corrupt else 0)) & 0xFFFFFFFF
            ctypes.c_uint32.from_buffer(raw, 48 * i + 16).value = value
        self.nodes.append(raw)

    def api(self):
        def begin(stream, mode):
            self.capturing = True
            return 0

        def end(stream, graph):
            self.capturing = False
            graph._obj.value = 0x6A
            return 0

        def get_nodes(graph, nodes, n):
            order = self.order or list(range(len(self.nodes)))
            if nodes is None:  # the copies' memcpy and the kernels' nodes besides the batches
                n._obj.value = len(order) + self.copies + self.kernels
                return 0
            for i, k in enumerate(order):
                nodes[i] = 1000 + k
            for i in range(self.copies + self.kernels):
                nodes[len(order) + i] = 7 if i < self.copies else 8
            return 0

        def node_type(node, kind):
            kind._obj.value = {7: sg._NODE_MEMCPY, 8: sg._NODE_KERNEL}.get(node, sg._NODE_BATCH_MEM_OP)
            return 0

        def get_params(node, p):
            raw = self.nodes[node - 1000]
            p._obj.ctx, p._obj.count, p._obj.array = 0xC0, len(raw) // 48, ctypes.addressof(raw)
            return 0

        def instantiate(exe, graph, flags):
            exe._obj.value = 0xE7
            return 0

        def set_params(exe, node, p):
            params = p._obj
            raw = ctypes.string_at(params.array, 48 * params.count)
            values = [int.from_bytes(raw[i + 16:i + 20], "little") for i in range(0, len(raw), 48)]
            self.calls.append(("set", _v(exe), node, params.ctx, values))
            return 0

        def launch(exe, stream):
            self.calls.append(("launch", _v(exe), stream))
            return 0

        def destroy(handle):
            self.calls.append(("destroy", _v(handle)))
            return 0

        return {"cuStreamBeginCapture": begin, "cuStreamEndCapture": end, "cuGraphGetNodes": get_nodes,
                "cuGraphNodeGetType": node_type, "cuGraphBatchMemOpNodeGetParams": get_params,
                "cuGraphInstantiateWithFlags": instantiate, "cuGraphExecBatchMemOpNodeSetParams": set_params,
                "cuGraphLaunch": launch, "cuGraphExecDestroy": destroy, "cuGraphDestroy": destroy}


class _FakeProgram:
    def __init__(self, driver, steps):
        self.driver, self.steps = driver, steps

    def launch_slot(self, k, stream, seq):
        assert self.driver.capturing and k == 0
        for step in self.steps:
            if isinstance(step, SignalBatch):
                self.driver.record_batch(step.signals, seq)


class _Cu:
    @staticmethod
    def CUstream(handle):  # noqa: N802
        return ("stream", handle)


STEPS = (SignalBatch((SignalStep(True, 0x100, 0), SignalStep(False, 0x204, 0))), CopyStep(1, 2, 64),
         SignalBatch((SignalStep(False, 0x208, 1), SignalStep(True, 0x10C, -1))))


@pytest.mark.parametrize("order", [None, [1, 0]])
def test_each_launch_writes_the_calls_values_into_every_node_then_launches(monkeypatch, order):
    fake = _FakeDriver(order=order)
    monkeypatch.setattr(sg, "_api", fake.api)
    graph = sg.SettledGraph(_FakeProgram(fake, STEPS), STEPS, 0x51, _Cu)
    for seq, stream in ((7, 0x99), (0, 0)):  # seq 0: the -1 wraps
        fake.calls.clear()
        graph.launch(stream, seq)
        sets = sorted(c[2:] for c in fake.calls if c[0] == "set")
        assert sets == [(1000, 0xC0, [seq, seq]), (1001, 0xC0, [seq + 1, (seq - 1) & 0xFFFFFFFF])]
        assert fake.calls[-1] == ("launch", 0xE7, stream) and len(fake.calls) == 3
    graph.close()
    assert fake.calls[-2:] == [("destroy", 0xE7), ("destroy", 0x6A)]


def test_a_node_holding_other_values_than_asked_is_refused_and_freed(monkeypatch):
    fake = _FakeDriver(corrupt=True)
    monkeypatch.setattr(sg, "_api", fake.api)
    with pytest.raises(ValueError, match="another value"):
        sg.SettledGraph(_FakeProgram(fake, STEPS), STEPS, 0x51, _Cu)
    assert ("destroy", 0x6A) in fake.calls and not fake.capturing


def test_a_graph_holding_other_work_than_its_program_is_refused(monkeypatch):
    # two memcpy nodes where the program has one copy: something else was queued on the stream
    fake = _FakeDriver(copies=2)
    monkeypatch.setattr(sg, "_api", fake.api)
    with pytest.raises(ValueError, match="2 copies and 0 kernels where its program has 1 and 0"):
        sg.SettledGraph(_FakeProgram(fake, STEPS), STEPS, 0x51, _Cu)
    assert ("destroy", 0x6A) in fake.calls


def test_a_failed_launch_during_capture_still_ends_the_capture(monkeypatch):
    fake = _FakeDriver()
    monkeypatch.setattr(sg, "_api", fake.api)

    class Failing(_FakeProgram):
        def launch_slot(self, k, stream, seq):
            raise RuntimeError("CUDA driver error in cuMemcpyAsync")

    with pytest.raises(RuntimeError, match="cuMemcpyAsync"):
        sg.SettledGraph(Failing(fake, STEPS), STEPS, 0x51, _Cu)
    assert not fake.capturing and ("destroy", 0x6A) in fake.calls


class _FakeLibcuda:
    """A libcuda whose cuGetProcAddress finds every function (at an address never called)."""

    def __init__(self, missing=()):
        self.missing, self.asked = missing, []

        def get(*args):  # a plain function: the code sets its argtypes, as on a ctypes one
            return self._get(*args)
        self.cuGetProcAddress_v2 = get

    def _get(self, name, pfn, version, flags, status):
        self.asked.append((name.decode(), version))
        found = name.decode() not in self.missing
        pfn._obj.value = ctypes.cast(ctypes.pythonapi.Py_IsInitialized, ctypes.c_void_p).value if found else None
        status._obj.value = 0 if found else 1
        return 0


def test_the_route_is_off_where_asked_or_where_a_function_is_missing(monkeypatch):
    lib = _FakeLibcuda()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: lib)
    sg._api.cache_clear()
    try:
        monkeypatch.delenv("CONCCL_DISABLE", raising=False)
        assert sg.available() and {n for n, _ in lib.asked} == set(sg._SIGNATURES)
        sg._api.cache_clear()
        monkeypatch.setenv("CONCCL_DISABLE", "settled_graphs")
        assert not sg.available()
        sg._api.cache_clear()
        monkeypatch.delenv("CONCCL_DISABLE")
        monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeLibcuda(missing=("cuGraphExecBatchMemOpNodeSetParams",)))
        assert not sg.available()
    finally:
        sg._api.cache_clear()



def test_only_calls_on_the_peer_reachable_tensors_agreed_may_have_a_graph():
    class T:
        def __init__(self, address):
            self.address = address

        def data_ptr(self):
            return self.address

    inp, out = ((0x1000, 0x2000), (16, 32)), ((0x5000, 0x6000), (0, 0))
    assert sg.peer_reachable((inp, out), T(0x2020), T(0x6000), 1)
    assert not sg.peer_reachable((None, out), T(0x2020), T(0x6000), 1)
    assert not sg.peer_reachable((inp, None), T(0x2020), T(0x6000), 1)
    # a parts call: its output is another (plain) tensor than the agreed view's
    assert not sg.peer_reachable((inp, out), T(0x2020), T(0x9000), 1)


def test_which_pipelines_may_run_as_a_graph():
    from conccl.executors.cuda.lowering import ComputeStep

    gemm = ComputeStep(object())
    copy = CopyStep(1, 2, 8 << 20)  # a decode shard: above a flat call's bound, within a pipeline's
    ctrl = (SignalBatch((R,)), SignalBatch((W,)))
    assert sg.graphable_pipeline((ctrl, (SignalBatch((W,)), copy, SignalBatch((R,))), (gemm, SignalBatch((R,)))))
    assert sg.graphable_pipeline(((SignalBatch((W,)), ReduceStep(1, (2, 3), 8, "bfloat16", 1.0)), (gemm,)))
    assert not sg.graphable_pipeline((ctrl, (SignalBatch((W,)), copy)))  # no GEMM step: a flat call's
    assert not sg.graphable_pipeline(((gemm, copy),))  # no signal: nothing to write per call
    assert not sg.graphable_pipeline((ctrl, (W, copy), (gemm,)))  # single signals
    big = CopyStep(1, 2, sg.PIPELINE_GRAPH_MAX_BYTES // 2 + 1)
    assert not sg.graphable_pipeline((ctrl, (big,), (big, gemm)))
    spin = OneShotStep(*([None] * len(OneShotStep._fields)))
    assert not sg.graphable_pipeline((ctrl, (spin, gemm)))


def test_a_graphs_nodes_are_checked_against_its_steps():
    from conccl.executors.cuda.lowering import ComputeStep

    copy, red, gemm = CopyStep(1, 2, 64), ReduceStep(1, (2, 3), 8, "float32", 1.0), ComputeStep(object())
    sg.check_node_counts({sg._NODE_MEMCPY: 2, sg._NODE_KERNEL: 1}, (copy, copy, red))
    with pytest.raises(ValueError, match="2 copies and 2 kernels where its program has 2 and 1"):
        sg.check_node_counts({sg._NODE_MEMCPY: 2, sg._NODE_KERNEL: 2}, (copy, copy, red))
    with pytest.raises(ValueError, match=r"type\(s\) \[2\]"):  # a memset nobody asked for
        sg.check_node_counts({sg._NODE_MEMCPY: 1, sg._NODE_MEMSET: 1}, (copy,))
    # GEMM steps: a kernel or more each (cuBLAS may split one), and cuBLAS's memsets
    sg.check_node_counts({sg._NODE_MEMCPY: 1, sg._NODE_KERNEL: 5, sg._NODE_MEMSET: 1}, (copy, gemm, gemm, red))
    with pytest.raises(ValueError, match="2 kernels where its program has 1 and 1 and 2 GEMM steps"):
        sg.check_node_counts({sg._NODE_MEMCPY: 1, sg._NODE_KERNEL: 2}, (copy, gemm, gemm, red))
    with pytest.raises(ValueError, match="0 copies"):  # a copy the capture lost
        sg.check_node_counts({sg._NODE_KERNEL: 3}, (copy, gemm, red))
    with pytest.raises(ValueError, match=r"type\(s\) \[3\]"):  # a host node: never ours
        sg.check_node_counts({sg._NODE_MEMCPY: 1, sg._NODE_KERNEL: 3, 3: 1}, (copy, gemm, red))


def test_a_queued_pipeline_is_captured_whole_and_its_nodes_written_per_call(monkeypatch):
    """``SettledGraph(queue=...)``: the queue callback queues every slot under the capture (here
    two slots' batches and a GEMM step's kernel), and each launch writes the call's values into
    the nodes of every slot."""
    from conccl.executors.cuda.lowering import ComputeStep

    fake = _FakeDriver(copies=1, kernels=2)
    monkeypatch.setattr(sg, "_api", fake.api)
    slot0 = (SignalBatch((SignalStep(False, 0x204, 0),)),)
    slot1 = (SignalBatch((SignalStep(True, 0x100, 0),)), CopyStep(1, 2, 64), ComputeStep(object()),
             SignalBatch((SignalStep(False, 0x300, 0), SignalStep(False, 0x208, 1))))
    queued = []

    def queue(stream, seq):
        assert fake.capturing and stream == 0x51
        queued.append(seq)
        for slot in (slot0, slot1):
            for step in slot:
                if isinstance(step, SignalBatch):
                    fake.record_batch(step.signals, seq)

    graph = sg.SettledGraph(None, slot0 + slot1, 0x51, _Cu, queue=queue)
    assert queued == [sg._PLACEHOLDER] and not fake.capturing
    fake.calls.clear()
    graph.launch(0x99, 41)
    sets = sorted(c[2:] for c in fake.calls if c[0] == "set")
    assert sets == [(1000, 0xC0, [41]), (1001, 0xC0, [41]), (1002, 0xC0, [41, 42])]
    assert fake.calls[-1] == ("launch", 0xE7, 0x99)


def test_a_graph_captured_by_its_owner_is_its_owners_to_destroy(monkeypatch):
    """``SettledGraph(capture=...)`` (PyTorch's CUDAGraph for a pipeline's GEMM steps): the owner
    begins and ends the capture and instantiates, the driver's capture calls are not made, nodes
    are still checked and written per launch, and closing leaves the graph to its owner."""
    fake = _FakeDriver()
    api = fake.api()
    for name in ("cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiateWithFlags"):
        api[name] = lambda *a, _n=name: pytest.fail(f"{_n} called for an owner-captured graph")
    monkeypatch.setattr(sg, "_api", lambda: api)
    calls = []

    class Owner:
        def begin(self, stream):
            calls.append(("begin", stream))
            fake.capturing = True

        def end(self):
            calls.append("end")
            fake.capturing = False
            return 0x6A

        def instantiate(self):
            calls.append("instantiate")
            return 0xE7

        def close(self):
            calls.append("close")

    graph = sg.SettledGraph(_FakeProgram(fake, STEPS), STEPS, 0x51, _Cu, capture=Owner())
    assert calls == [("begin", 0x51), "end", "instantiate"]
    fake.calls.clear()
    graph.launch(0x99, 3)
    assert fake.calls[-1] == ("launch", 0xE7, 0x99) and sum(c[0] == "set" for c in fake.calls) == 2
    graph.close()
    assert calls[-1] == "close" and not any(c[0] == "destroy" for c in fake.calls)
