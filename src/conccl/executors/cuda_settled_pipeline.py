"""A settled eager pipeline (a ``conccl.tp`` call) captured once as a CUDA graph and launched
whole (issue 38 item 4).

An eager pipelined call costs ~0.3-0.5 ms of host time on 2 x H200 (session 13's
host_profile.py): the driver calls of four streams, two ``torch.mm`` launches, events. Called
again on the same buffers (a decode loop, a layer's steps), from the GRAPH_AFTER-th call with
the same GEMM-step buffers its whole program (every slot, its GEMM steps included) is one graph,
whose stream memory operations get the call's sequence number per launch
(:mod:`conccl.executors.cuda_graph_launch`): the same operations, in the same order, with the
same values as the driver calls would queue, so a peer need not take the same route. Keyed by
what the GEMM steps touch (``compute.buffers``, conccl.tp's tensors' address, shape, strides)
besides the program's buffers; only for blocking calls (an async call's tensors are marked in
use on the streams its steps ran on, which a replay does not run on); and only where every copy
is between GPUs (:func:`~conccl.executors.cuda_graph_launch.same_gpu_copies`).
"""
from __future__ import annotations

import time
import warnings

import torch

from .._driver import driver
from . import cuda_graph_launch as settled_graphs
from .cuda_program import CompiledProgram, lower

MAX_PIPELINE_GRAPHS = 8  # per program: a layer's calls alternate between few buffer sets


class TorchCapture:
    """A settled pipeline captured by PyTorch's CUDAGraph into the executor's private memory pool
    (the ``capture`` of :class:`~conccl.executors.cuda_graph_launch.SettledGraph`). Its GEMM
    steps' cuBLAS kernels use the workspace PyTorch keeps per stream, which
    ``torch._C._cuda_clearCublasWorkspaces()`` (called by every CUDAGraph capture, and by users)
    hands back to the caching allocator: a graph captured by the driver alone would replay into
    memory some tensor may hold by then. Captured here, the workspace is allocated in the pool,
    which only captures into it draw from and which lives as long as the executor. One pool for
    all: the graphs run one after another in the group's stream order, so sharing a workspace
    block is safe."""

    def __init__(self, pool, device):
        self.pool, self.device, self.graph, self.stream = pool, device, None, None

    def begin(self, handle: int) -> None:
        self.graph = torch.cuda.CUDAGraph(keep_graph=True)
        self.stream = torch.cuda.ExternalStream(handle, device=self.device)
        with torch.cuda.stream(self.stream):
            self.graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")

    def end(self) -> int:
        with torch.cuda.stream(self.stream):
            self.graph.capture_end()
        return self.graph.raw_cuda_graph()

    def instantiate(self) -> int:
        self.graph.instantiate()
        return self.graph.raw_cuda_graph_exec()

    def close(self) -> None:
        self.graph = None  # PyTorch destroys the graph and its exec



def settled_pipeline(ex, entry, buffers: tuple, compute, addresses):
    """The graph of ``entry`` (the executor ``ex``'s cached program of a pipeline) whose GEMM
    steps (``compute``) touch ``buffers``, once this is its GRAPH_AFTER-th call with them, made
    now; None before; False where it cannot have one (its calls stay driver calls).
    ``addresses()``: the program's ``address(rank, buf)`` for lowering. The GEMM steps are
    captured on the streams they run on eagerly, forked from the capture stream before the
    control slot and joined back, as :meth:`CudaCopyEngineExecutor.run` queues them."""
    record = entry.pipelines.get(buffers)
    if record is None:
        if len(entry.pipelines) >= MAX_PIPELINE_GRAPHS:
            entry.close_graphs()
        record = entry.pipelines[buffers] = [0, None]
    record[0] += 1
    if record[1] is not None or record[0] < settled_graphs.GRAPH_AFTER:
        return record[1]
    record[1] = False
    if not (settled_graphs.available() and settled_graphs.graphable_pipeline(entry.lowered)
            and not settled_graphs.same_gpu_copies(entry.schedule)):
        return False
    t0 = time.perf_counter()
    try:
        lowered = lower(entry.schedule, addresses(), ex._pads,
                        ex.batching, batch_copies=False, marks=ex._marks, spin_words=ex._spin_words)
        program = CompiledProgram(lowered, driver(), ex._device_index)
        if ex._capture_stream is None:
            ex._capture_stream = settled_graphs.create_stream()
        fork, joins = torch.cuda.Event(), [torch.cuda.Event() for _ in lowered]

        def queue(handle, seq):  # the eager fork and join, captured
            origin = torch.cuda.ExternalStream(handle, device=ex.device)
            # The fork before the control slot, as run() records its start: that slot waits
            # for the peers' signals of this call, which the other slots' copies let them send
            # (a push pipeline's graph forked after it hung on 2 x H200, session 14 run2).
            fork.record(origin)
            program.launch_slot(0, driver().CUstream(handle), seq, ex._on(origin, compute))
            for k in range(1, len(lowered)):
                stream = ex._streams[k]
                stream.wait_event(fork)
                program.launch_slot(k, ex._cu_streams_pool[k], seq, ex._on(stream, compute))
                joins[k].record(stream)
                origin.wait_event(joins[k])

        steps = tuple(step for slot in lowered for step in slot)
        if ex._pipeline_pool is None:
            ex._pipeline_pool = torch.cuda.graph_pool_handle()
        record[1] = settled_graphs.SettledGraph(program, steps, ex._capture_stream, driver(), queue=queue,
                                                capture=TorchCapture(ex._pipeline_pool, ex.device))
        ex.programs_graphed += 1
        ex.pipelines_graphed += 1
    except Exception as e:  # noqa: BLE001 - any failure here leaves the driver calls, which work
        ex.graph_failures += 1
        if ex.graph_failures == 1:
            warnings.warn(f"conccl: a settled {entry.schedule.collective} pipeline could not be launched as a "
                          f"graph ({e}); its calls stay driver calls", stacklevel=4)
    ex.program_compile_s += time.perf_counter() - t0
    return record[1]
