"""A settled call's program launched as one CUDA graph, its signal values rewritten per call.

A settled eager call (the same buffers as its last calls) spent most of its host time in the
driver, not in Python: on 2 x H100 (docs/results.md, host time) one
``cuMemcpyAsync`` costs 4.9 us of host time, a ``cuMemcpyBatchAsync`` of two copies 8.9 us,
a batch of two stream memory operations 2.1 us, through cuda-python or ctypes alike, while
launching a whole graph costs 2.6 us. So a program about to run for the :data:`GRAPH_AFTER`-th
time on the same buffers is captured once into a graph (its copies as memcpy nodes, as a captured
call's are), and each later call writes its sequence number into the graph's memory-operation
nodes (``cuGraphExecBatchMemOpNodeSetParams``: launches already queued keep their values) and
launches it. The graph holds the same operations, in the same order, on the same stream, with
the same signal values as the driver calls would queue: a peer need not take the same route,
and the watchdog, its release and the board's checks see no difference.

Only programs of one slot whose signals are batches of memory operations, with no one-shot
kernel or pipeline step, and at most :data:`GRAPH_MAX_BYTES` of copies (a graph's copies run
one after another on one stream; ``cuMemcpyBatchAsync`` spreads large ones over the engines).
``CONCCL_DISABLE=settled_graphs`` keeps every call on driver calls.

A settled pipeline (a ``conccl.tp`` call: its GEMM steps cut into the program's slots) is
captured the same way, every slot forked from the capture stream and joined back, its GEMM
steps' kernels with the buffers they read and write: the executor keys it by those buffers
(``compute.buffers``) besides the program's, and makes one only for blocking calls (an async
call's tensors are marked in use on the streams the steps ran on, which a replay does not
run on). Its host time is the cache hit, the nodes' values and one launch, where the driver
calls of four streams and two ``torch.mm`` launches took ~0.3-0.5 ms (2 x H200).

Only calls whose input and output are peer-reachable on every rank (``conccl.empty`` tensors,
symmetric memory): a graph replayed some copies of calls on PyTorch's own (caching-allocator)
tensors as SM kernels (``memcpy32_post``, ``memcpy128``), where the same copies made as driver
calls stay on copy engines, and a copy-engine collective must not bring that SM back. On 2 x
H100 (tests/gpu/test_gpu_settled_graph.py) the all-gather, all-to-all and
all-reduce of plain tensors showed them (the staged input's copy read back from the workspace
as well), the calls on symmetric tensors none; which copies the driver turns into kernels was
not pinned down (the same plain-to-plain copy was a kernel once and a copy-engine record later
in one process), so plain tensors keep their driver calls.
"""
from __future__ import annotations

import ctypes
import functools

from ... import env
from ...schedule.base import Copy
from .lowering import ComputeStep, CopyBatch, CopyStep, ReduceStep, SignalBatch

GRAPH_AFTER = 3  # the call that would run a program for this many-th time captures and launches it
GRAPH_MAX_BYTES = 4 << 20  # copies per call, above which the batched driver calls stay
# A pipeline's copies per call: each peer's pieces are on a slot (a branch of the graph) of
# their own, so a batch spreads nothing more over the engines; what bounds it is where host
# time still matters (a decode step's 8 MiB shards; 0.5 ms of GEMM hides the host's calls).
PIPELINE_GRAPH_MAX_BYTES = 64 << 20
_PARAM_BYTES = 48  # sizeof(CUstreamBatchMemOpParams): a union padded to 6 x 64 bits
_ADDRESS_OFFSET, _VALUE_OFFSET = 8, 16  # of a wait or write op's address and 32-bit value
_PLACEHOLDER = 0x5EED0000  # the sequence number the graph is captured with (checked in its nodes)
_VP, _U64, _SIZE = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t


class _NodeParams(ctypes.Structure):
    # CUDA_BATCH_MEM_OP_NODE_PARAMS: ctx, count, paramArray, flags
    _fields_ = [("ctx", _VP), ("count", ctypes.c_uint), ("array", _VP), ("flags", ctypes.c_uint)]


_SIGNATURES = {  # name: (CUDA version of the signature, argument types)
    "cuStreamBeginCapture": (12000, [_VP, ctypes.c_int]),
    "cuStreamEndCapture": (12000, [_VP, ctypes.POINTER(_VP)]),
    "cuGraphInstantiateWithFlags": (12000, [ctypes.POINTER(_VP), _VP, ctypes.c_ulonglong]),
    "cuGraphGetNodes": (12000, [_VP, ctypes.POINTER(_VP), ctypes.POINTER(_SIZE)]),
    "cuGraphNodeGetType": (12000, [_VP, ctypes.POINTER(ctypes.c_int)]),
    "cuGraphBatchMemOpNodeGetParams": (12000, [_VP, ctypes.POINTER(_NodeParams)]),
    "cuGraphExecBatchMemOpNodeSetParams": (12000, [_VP, _VP, ctypes.POINTER(_NodeParams)]),
    "cuGraphLaunch": (12000, [_VP, _VP]),
    "cuGraphExecDestroy": (12000, [_VP]),
    "cuGraphDestroy": (12000, [_VP]),
    "cuStreamCreate": (12000, [ctypes.POINTER(_VP), ctypes.c_uint]),
    "cuStreamDestroy": (12000, [_VP]),
}
# CUstreamCaptureMode THREAD_LOCAL: other threads (the watchdog's event queries) go on meanwhile
_CAPTURE_THREAD_LOCAL = 1
_NODE_BATCH_MEM_OP = 12  # CUgraphNodeType
_NODE_MEMCPY, _NODE_KERNEL, _NODE_MEMSET, _NODE_EMPTY = 1, 0, 2, 5


# cuGetProcAddress's CU_GET_PROC_ADDRESS_LEGACY_STREAM: a stream handle 0 passed to what it hands
# out is the legacy default stream, PyTorch's default stream (not a per-thread one)
_LEGACY_STREAM = 1


def driver_functions(signatures: dict) -> dict | None:
    """{name: ctypes function} for ``signatures`` ({name: (CUDA version of the signature,
    argument types)}, each returning a CUresult), as libcuda's ``cuGetProcAddress`` hands them
    out; None where libcuda or any of them is missing."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        get = lib.cuGetProcAddress_v2
    except (OSError, AttributeError):
        return None
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(_VP), ctypes.c_int, _U64, ctypes.POINTER(ctypes.c_int)]
    get.restype = ctypes.c_int
    out = {}
    for name, (version, args) in signatures.items():
        pfn, status = _VP(), ctypes.c_int(-1)
        if (get(name.encode(), ctypes.byref(pfn), version, _LEGACY_STREAM, ctypes.byref(status)) or status.value
                or not pfn.value):
            return None
        out[name] = ctypes.CFUNCTYPE(ctypes.c_int, *args)(pfn.value)
    return out


@functools.lru_cache(maxsize=1)
def _api():
    """The functions a settled graph calls, or None where any is missing (or turned off)."""
    if env.disabled("settled_graphs"):
        return None
    return driver_functions(_SIGNATURES)


def available() -> bool:
    return _api() is not None


def create_stream() -> int:
    """A new stream of the current context for captures (``CU_STREAM_NON_BLOCKING``): its raw
    handle. Not one of PyTorch's pooled streams, which another group or thread may be using."""
    handle = _VP()
    _check(_api()["cuStreamCreate"](ctypes.byref(handle), 1), "cuStreamCreate")
    return handle.value


def destroy_stream(handle: int) -> None:
    _api()["cuStreamDestroy"](handle)


def _tally(lowered: tuple) -> tuple[int, int, int] | None:
    """(copy bytes, signal batches, GEMM steps) of a lowered program, None where it holds a step
    a graph cannot take (a single stream memory operation, a spin wait, a one-shot kernel)."""
    nbytes, batches, computes = 0, 0, 0
    for steps in lowered:
        for step in steps:
            if isinstance(step, SignalBatch):
                batches += 1
            elif isinstance(step, ComputeStep):
                computes += 1
            elif isinstance(step, CopyStep):
                nbytes += step.nbytes
            elif isinstance(step, CopyBatch):
                nbytes += sum(c.nbytes for c in step.copies)
            elif not isinstance(step, ReduceStep):
                return None
    return nbytes, batches, computes


def graphable(lowered: tuple) -> bool:
    """Whether a lowered program (:func:`conccl.executors.cuda.lowering.lower`) may run as a
    settled graph: one slot of signal batches, copies and reductions, copies within
    :data:`GRAPH_MAX_BYTES`, at least one signal batch (what the graph's values come from)."""
    tally = _tally(lowered) if len(lowered) == 1 else None
    return tally is not None and tally[2] == 0 and tally[1] > 0 and tally[0] <= GRAPH_MAX_BYTES


def graphable_pipeline(lowered: tuple) -> bool:
    """Whether a lowered pipeline (slots of signal batches, copies, reductions and GEMM steps)
    may run as a settled graph: at least one GEMM step and one signal batch, copies within
    :data:`PIPELINE_GRAPH_MAX_BYTES`, nothing else (no single stream memory operation, spin
    wait or one-shot kernel)."""
    tally = _tally(lowered)
    return tally is not None and tally[2] > 0 and tally[1] > 0 and tally[0] <= PIPELINE_GRAPH_MAX_BYTES


def same_gpu_copies(schedule) -> bool:
    """Whether ``schedule`` copies within one GPU (a pull pipeline's staging of a plain input, a
    kept own chunk): captured into a graph, such a copy ran as an SM kernel (``memcpy128``,
    2 x H200) where the eager call's is a copy engine's, so a pipeline
    holding one keeps its driver calls."""
    return any(isinstance(op, Copy) and op.transfer.src_rank == op.transfer.dst_rank
               for ops in schedule.slots for op in ops)


def check_node_counts(counts: dict, steps: tuple) -> None:
    """Raise unless a captured graph's nodes (``counts``: node type -> how many, memory
    operations left out) are what ``steps`` queue: one memcpy per copy and one kernel per
    reduction; with GEMM steps (:class:`ComputeStep`), at least one kernel more per step and
    any memsets or empty nodes (cuBLAS's own), nothing else."""
    computes = sum(isinstance(x, ComputeStep) for x in steps)
    copies = sum(isinstance(x, CopyStep) for x in steps)
    reductions = sum(isinstance(x, ReduceStep) for x in steps)
    other = {k: n for k, n in counts.items() if k not in (_NODE_MEMCPY, _NODE_KERNEL) and n}
    if computes:
        other = {k: n for k, n in other.items() if k not in (_NODE_MEMSET, _NODE_EMPTY)}
    if other:
        raise ValueError(f"a captured settled call holds nodes of type(s) {sorted(other)}")
    memcpys, kernels = counts.get(_NODE_MEMCPY, 0), counts.get(_NODE_KERNEL, 0)
    if memcpys != copies or (kernels < reductions + computes if computes else kernels != reductions):
        raise ValueError(f"a captured settled call holds {memcpys} copies and {kernels} kernels where its program "
                         f"has {copies} and {reductions}" + (f" and {computes} GEMM steps" if computes else ""))


def peer_reachable(views, input, output, rank: int) -> bool:
    """Whether ``input`` and ``output`` are the peer-reachable tensors ``views`` describe on every
    rank (the agreed (bases, offsets) of each, None where some rank's is PyTorch's own memory;
    a parts call passes another tensor than the view's): the only calls a settled graph runs
    (module doc)."""
    return all(view is not None and t.data_ptr() == view[0][rank] + view[1][rank]
               for view, t in ((views[0], input), (views[1], output)))


def match_nodes(node_ops: list, batches: list) -> list:
    """For each signal batch (a tuple of (is_wait, address) per op, in program order), the index
    of the captured memory-operation node holding the same ops; ``node_ops``: each node's ops
    as the driver keeps them. Raises ValueError unless every batch matches exactly one node and
    every node one batch (then the graph is not used)."""
    if len(node_ops) != len(batches):
        raise ValueError(f"{len(node_ops)} memory-operation nodes for {len(batches)} signal batches")
    out = []
    for ops in batches:
        found = [i for i, n in enumerate(node_ops) if n == ops]
        if len(found) != 1:
            raise ValueError(f"a signal batch matches {len(found)} nodes")
        out.append(found[0])
    if len(set(out)) != len(out):
        raise ValueError("two signal batches match one node")
    return out


def _check(err: int, what: str) -> None:
    if err:
        raise RuntimeError(f"CUDA driver error {err} in {what} (a settled call's graph)")


class SettledGraph:
    """``program`` (a CompiledProgram of one slot, lowered without copy batches: ``steps``)
    captured once on ``capture_stream`` (a raw handle of a stream nothing else uses: the
    executor creates its own, not one of PyTorch's pooled streams) as a graph;
    :meth:`launch` queues it as call ``seq``. Raises where the capture does not give one memory
    operation node per signal batch holding what the batch asked (the caller keeps driver calls).

    ``queue(capture_stream, seq)``, given, queues the program instead (a pipeline's slots,
    forked from the capture stream and joined back); ``steps`` are then every slot's.
    ``capture``, given, captures and instantiates instead of the driver calls here, and owns
    the graph: ``begin(stream)``, ``end() -> graph``, ``instantiate() -> exec``, ``close()``
    (PyTorch's CUDAGraph for GEMM steps, whose cuBLAS workspace must live in the graph's memory
    pool: :class:`conccl.executors.cuda.settled_pipeline.TorchCapture`)."""

    def __init__(self, program, steps: tuple, capture_stream: int, cu, queue=None, capture=None):
        api = _api()
        self._api, self._capture = api, capture
        self._graph, self._exec = _VP(), _VP()
        batches = [s for s in steps if isinstance(s, SignalBatch)]
        if capture is None:
            _check(api["cuStreamBeginCapture"](capture_stream, _CAPTURE_THREAD_LOCAL), "cuStreamBeginCapture")
        else:
            capture.begin(capture_stream)
        try:
            try:
                if queue is None:
                    program.launch_slot(0, cu.CUstream(capture_stream), _PLACEHOLDER)
                else:
                    queue(capture_stream, _PLACEHOLDER)
            finally:  # ends the capture however the launch went: the stream must not stay captured
                if capture is None:
                    _check(api["cuStreamEndCapture"](capture_stream, ctypes.byref(self._graph)),
                           "cuStreamEndCapture")
                else:
                    self._graph = _VP(capture.end())
            nodes = self._memop_nodes(steps)
            params = [self._node_params(n) for n in nodes]
            sigs = [tuple((op == 1, address) for op, address, _ in p[2]) for p in params]
            order = match_nodes(sigs, [tuple((s.is_wait, s.address) for s in b.signals) for b in batches])
            self._updates = []
            for batch, index in zip(batches, order):
                ctx, raw, ops = params[index]
                for (_, _, value), signal in zip(ops, batch.signals):
                    if value != (_PLACEHOLDER + signal.seq_delta) & 0xFFFFFFFF:
                        raise ValueError("a captured signal holds another value than its batch asked for")
                array = (ctypes.c_char * len(raw)).from_buffer_copy(raw)
                values = tuple((ctypes.c_uint32.from_buffer(array, i * _PARAM_BYTES + _VALUE_OFFSET), s.seq_delta)
                               for i, s in enumerate(batch.signals))
                node_params = _NodeParams(ctx, len(batch.signals), ctypes.addressof(array), 0)
                self._updates.append((nodes[index], node_params, ctypes.byref(node_params), values, array))
            if capture is None:
                _check(api["cuGraphInstantiateWithFlags"](ctypes.byref(self._exec), self._graph, 0),
                       "cuGraphInstantiateWithFlags")
            else:
                self._exec = _VP(capture.instantiate())
        except BaseException:
            self.close()
            raise
        self._set = api["cuGraphExecBatchMemOpNodeSetParams"]
        self._launch = api["cuGraphLaunch"]

    def _memop_nodes(self, steps: tuple) -> list:
        """The graph's memory-operation nodes; raises unless its other nodes are what ``steps``
        queue (:func:`check_node_counts`: nothing else was queued on the streams while it was
        captured)."""
        api, n = self._api, _SIZE(0)
        _check(api["cuGraphGetNodes"](self._graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        nodes = (_VP * n.value)()
        _check(api["cuGraphGetNodes"](self._graph, nodes, ctypes.byref(n)), "cuGraphGetNodes")
        out, kind, counts = [], ctypes.c_int(-1), {}
        for node in nodes[:n.value]:
            _check(api["cuGraphNodeGetType"](node, ctypes.byref(kind)), "cuGraphNodeGetType")
            if kind.value == _NODE_BATCH_MEM_OP:
                out.append(node)
            else:
                counts[kind.value] = counts.get(kind.value, 0) + 1
        check_node_counts(counts, steps)
        return out

    def _node_params(self, node) -> tuple:
        """(context, the ops' raw bytes, [(operation, address, value)] per op) of a node."""
        p = _NodeParams()
        _check(self._api["cuGraphBatchMemOpNodeGetParams"](node, ctypes.byref(p)), "cuGraphBatchMemOpNodeGetParams")
        raw = ctypes.string_at(p.array, _PARAM_BYTES * p.count)
        ops = [(int.from_bytes(raw[i:i + 4], "little"),
                int.from_bytes(raw[i + _ADDRESS_OFFSET:i + _ADDRESS_OFFSET + 8], "little"),
                int.from_bytes(raw[i + _VALUE_OFFSET:i + _VALUE_OFFSET + 4], "little"))
               for i in range(0, len(raw), _PARAM_BYTES)]
        return p.ctx, raw, ops

    def launch(self, stream: int, seq: int) -> None:
        """Queue the graph on ``stream`` (a raw handle) as call ``seq``."""
        exe = self._exec
        for node, _, ref, values, _ in self._updates:
            for value, delta in values:
                value.value = (seq + delta) & 0xFFFFFFFF
            err = self._set(exe, node, ref)
            if err:
                _check(err, "cuGraphExecBatchMemOpNodeSetParams")
        err = self._launch(exe, stream)
        if err:
            _check(err, "cuGraphLaunch")

    def close(self) -> None:
        """Destroy the graph (launches already queued still run: the driver keeps what they use)."""
        if self._capture is not None:  # its owner's to destroy
            self._capture.close()
            self._graph, self._exec = _VP(), _VP()
            return
        if self._exec.value:
            self._api["cuGraphExecDestroy"](self._exec)
            self._exec = _VP()
        if self._graph.value:
            self._api["cuGraphDestroy"](self._graph)
            self._graph = _VP()
