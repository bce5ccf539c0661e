"""A settled call's program launched as one CUDA graph, its signal values rewritten per call.

A settled eager call (the same buffers as its last calls) spent most of its host time in the
driver, not in Python: on 2 x H100 (benchmarks/2026-11-26-h100x2-session7, the probe) one
``cuMemcpyAsync`` costs 4.9 us of host time, a ``cuMemcpyBatchAsync`` of two copies 8.9 us,
a batch of two stream memory operations 2.1 us, through cuda-python or ctypes alike, while
launching a whole graph costs 2.6 us. So a program that has run :data:`GRAPH_AFTER` times on
the same buffers is captured once into a graph (its copies as memcpy nodes, as a captured
call's are), and each later call writes its sequence number into the graph's memory-operation
nodes (``cuGraphExecBatchMemOpNodeSetParams``: launches already queued keep their values) and
launches it. The graph holds the same operations, in the same order, on the same stream, with
the same signal values as the driver calls would queue: a peer need not take the same route,
and the watchdog, its release and the board's checks see no difference.

Only programs of one slot whose signals are batches of memory operations, with no one-shot
kernel or pipeline step, and at most :data:`GRAPH_MAX_BYTES` of copies (a graph's copies run
one after another on one stream; ``cuMemcpyBatchAsync`` spreads large ones over the engines).
``CONCCL_SETTLED_GRAPHS=0`` keeps every call on driver calls.

A graph replays a copy between two of PyTorch's own (caching-allocator) tensors on one GPU as
an SM kernel (``memcpy32_post``), where the same copy made eagerly, or any copy touching
symmetric (VMM-mapped) or peer memory, stays on a copy engine (``graph_copy_kinds.py`` in
session 7's benchmarks, 2 x H100). A copy-engine collective must not bring that SM back, so
such a copy (the own shard of an all-gather or all-to-all of plain tensors) reads the copy of
the input the call staged in the symmetric workspace instead (:func:`own_copies_from_staging`),
and a program with one that has no staged source keeps its driver calls.

The graph is built and driven through ctypes on the driver's C API (``cuGetProcAddress``):
cuda-python's binding takes a fresh Python list for a node's parameters at every call; here
each node's parameters are one C array, written in place.
"""
from __future__ import annotations

import ctypes
import functools
import os

import dataclasses

from ..schedule import Buf, Copy, Phase, Schedule
from .cuda_program import CopyBatch, CopyStep, ReduceStep, SignalBatch

GRAPH_AFTER = 3  # the call that finds its program run this many times before launches a graph
GRAPH_MAX_BYTES = 4 << 20  # copies per call, above which the batched driver calls stay
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
}
# CUstreamCaptureMode THREAD_LOCAL: other threads (the watchdog's event queries) go on meanwhile
_CAPTURE_THREAD_LOCAL = 1
_NODE_BATCH_MEM_OP = 12  # CUgraphNodeType
_NODE_MEMCPY, _NODE_KERNEL = 1, 0


@functools.lru_cache(maxsize=1)
def _api():
    """{name: ctypes function} from the driver, or None where any is missing (or turned off)."""
    if os.environ.get("CONCCL_SETTLED_GRAPHS", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        get = lib.cuGetProcAddress_v2
    except (OSError, AttributeError):
        return None
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(_VP), ctypes.c_int, _U64, ctypes.POINTER(ctypes.c_int)]
    get.restype = ctypes.c_int
    out = {}
    for name, (version, args) in _SIGNATURES.items():
        pfn, status = _VP(), ctypes.c_int(-1)
        if get(name.encode(), ctypes.byref(pfn), version, 0, ctypes.byref(status)) or status.value or not pfn.value:
            return None
        out[name] = ctypes.CFUNCTYPE(ctypes.c_int, *args)(pfn.value)
    return out


def available() -> bool:
    return _api() is not None


def graphable(lowered: tuple) -> bool:
    """Whether a lowered program (:func:`conccl.executors.cuda_program.lower`) may run as a
    settled graph: one slot of signal batches, copies and reductions, copies within
    :data:`GRAPH_MAX_BYTES`, at least one signal batch (what the graph's values come from)."""
    if len(lowered) != 1:
        return False
    (steps,) = lowered
    nbytes, batches = 0, 0
    for step in steps:
        if isinstance(step, SignalBatch):
            batches += 1
        elif isinstance(step, CopyStep):
            nbytes += step.nbytes
        elif isinstance(step, CopyBatch):
            nbytes += sum(c.nbytes for c in step.copies)
        elif not isinstance(step, ReduceStep):
            return False
    return batches > 0 and nbytes <= GRAPH_MAX_BYTES


def own_copies_from_staging(schedule: Schedule, plain_input: bool, plain_output: bool) -> Schedule | None:
    """``schedule`` with every copy between this rank's own plain tensors (``plain_input`` /
    ``plain_output``: not peer-reachable, PyTorch's memory) reading instead the bytes an earlier
    staging copy of its slot put in the workspace (the same bytes, already there: copy-engine
    records in a graph, where a plain-to-plain copy is a kernel); ``schedule`` itself where it
    has none; None where one has no staged source (its program keeps driver calls)."""
    rank = schedule.rank
    plain = {Buf.INPUT: plain_input, Buf.OUTPUT: plain_output, Buf.WORKSPACE: False}
    slots, changed = [], False
    for ops in schedule.slots:
        staged, out = [], []
        for op in ops:
            t = op.transfer if isinstance(op, Copy) else None
            if t is not None and t.src_rank == t.dst_rank == rank and plain[t.src] and plain[t.dst]:
                source = next((s for s in staged if s.src is t.src and s.src_offset <= t.src_offset
                               and t.src_offset + t.nbytes <= s.src_offset + s.nbytes), None)
                if source is None:
                    return None
                op = Copy(dataclasses.replace(t, src=Buf.WORKSPACE,
                                              src_offset=source.dst_offset + t.src_offset - source.src_offset))
                changed = True
            elif (t is not None and t.phase is Phase.STAGE and t.src_rank == t.dst_rank == rank
                  and t.dst is Buf.WORKSPACE and t.src is not Buf.WORKSPACE):
                staged.append(t)
            out.append(op)
        slots.append(tuple(out))
    return dataclasses.replace(schedule, slots=tuple(slots)) if changed else schedule


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
    captured once on ``capture_stream`` (a raw handle, a stream nothing else uses) as a graph;
    :meth:`launch` queues it as call ``seq``. Raises where the capture does not give one memory
    operation node per signal batch holding what the batch asked (the caller keeps driver calls)."""

    def __init__(self, program, steps: tuple, capture_stream: int, cu):
        api = _api()
        self._api = api
        self._graph, self._exec = _VP(), _VP()
        batches = [s for s in steps if isinstance(s, SignalBatch)]
        _check(api["cuStreamBeginCapture"](capture_stream, _CAPTURE_THREAD_LOCAL), "cuStreamBeginCapture")
        try:
            try:
                program.launch_slot(0, cu.CUstream(capture_stream), _PLACEHOLDER)
            finally:  # ends the capture however the launch went: the stream must not stay captured
                _check(api["cuStreamEndCapture"](capture_stream, ctypes.byref(self._graph)), "cuStreamEndCapture")
            nodes = self._memop_nodes()
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
            _check(api["cuGraphInstantiateWithFlags"](ctypes.byref(self._exec), self._graph, 0),
                   "cuGraphInstantiateWithFlags")
        except BaseException:
            self.close()
            raise
        self._set = api["cuGraphExecBatchMemOpNodeSetParams"]
        self._launch = api["cuGraphLaunch"]

    def _memop_nodes(self) -> list:
        api, n = self._api, _SIZE(0)
        _check(api["cuGraphGetNodes"](self._graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        nodes = (_VP * n.value)()
        _check(api["cuGraphGetNodes"](self._graph, nodes, ctypes.byref(n)), "cuGraphGetNodes")
        out, kind = [], ctypes.c_int(-1)
        for node in nodes[:n.value]:
            _check(api["cuGraphNodeGetType"](node, ctypes.byref(kind)), "cuGraphNodeGetType")
            if kind.value == _NODE_BATCH_MEM_OP:
                out.append(node)
            elif kind.value not in (_NODE_MEMCPY, _NODE_KERNEL):
                raise ValueError(f"a captured settled call holds a node of type {kind.value}")
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
        if self._exec.value:
            self._api["cuGraphExecDestroy"](self._exec)
            self._exec = _VP()
        if self._graph.value:
            self._api["cuGraphDestroy"](self._graph)
            self._graph = _VP()
