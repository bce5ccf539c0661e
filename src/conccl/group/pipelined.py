"""A group's tensor-parallel calls: its agreed flat collective with the caller's GEMM cut in.

The peers agree on a flat all-gather or reduce-scatter (their rows are a flat call's: the same
validation, mismatch checks, timeouts and watchdog), and each rank transforms its own schedule
into a pipeline (:mod:`conccl.schedule.pipeline`, a pure function). The marks a pipeline adds are the
rank's own words, so ranks running different pipeline schedules still interoperate, except a
push pipeline with a pull one (their flat calls' algorithms differ: the call raises). Made
while the stream is captured, a pipeline is agreed as a captured flat call and captured with
its GEMM steps on a graph slot of its own (:mod:`conccl.schedule.captured`): a decode step's TP layers
replay as one graph.
"""
from __future__ import annotations

from ..collectives.all_gather import ALL_GATHER
from ..collectives.reduce_scatter import REDUCE_SCATTER
from ..schedule.pipeline import TPSchedule, gather_then_gemm, gemm_then_scatter
from .parts import moved_schedule


def _prepare(group, timeout):
    group.check_usable()
    return group.timeout_s(timeout)


def _agreed(group, local, timeout_s, captured: bool):
    """The agreed flat call (``captured``: the stream is being captured, asked once per call)."""
    if captured:
        return group.agree_captured(local, timeout_s)
    return group.agree_call(local, timeout_s)


def _run(group, moved, input, output, async_op, timeout_s, views, compute, captured: bool):
    """Queue the pipeline ``moved``, or capture it where the stream is being captured."""
    if captured:
        return group.capture_schedule(moved, input, output, views, timeout_s, compute=compute)
    return group.execute(moved, input, output, async_op, timeout_s, views, compute=compute)


def all_gather_then_compute(group, output, input, tp: TPSchedule, rows: int, row_bytes: int, compute,
                            async_op: bool = False, timeout=None, keep_own: bool = True):
    """All-gather ``input`` (``rows`` rows of ``row_bytes`` bytes) into ``output`` with
    ``compute(op)`` called for each :class:`~conccl.schedule.base.Compute` step of the pipeline
    ``tp``, each on a stream where the rows it names have landed (own rows: read them from
    ``input``). Pull, or ``tp.push``: pushed into the peers' workspace, where their GEMM steps
    read it (``compute(op, workspace)``, :class:`~conccl.schedule.base.Compute`); on the copy
    engines either way, the GEMM steps on the pipeline's own stream. ``keep_own`` False: a
    pipelined (not serial) schedule leaves the output's own chunk unwritten (the caller does
    not read it, nor do the GEMM steps), saving a same-GPU copy on SMs; a push pipeline then
    writes nothing into the output."""
    local = group.local_steps.step(ALL_GATHER, output, input, (), tp.flat_algorithm(), tp.stream_mode())
    timeout_s = _prepare(group, timeout)
    captured = group.executor.capturing()
    schedule, views = _agreed(group, local, timeout_s, captured)
    moved = moved_schedule(group, schedule, "gather_then_gemm", (tp, rows, row_bytes, keep_own, captured),
                   lambda s: gather_then_gemm(s, tp, rows, row_bytes, keep_own, captured))
    return _run(group, moved, input, output, async_op, timeout_s, views, compute, captured)


def compute_then_reduce_scatter(group, output, input, op, tp: TPSchedule, rows: int, row_bytes: int, compute,
                                async_op: bool = False, timeout=None):
    """Reduce-scatter ``input`` (``world * rows`` rows of ``row_bytes`` bytes, which
    ``compute(op)`` fills step by step) into ``output``: each piece leaves as soon as its step
    has computed it; the own rows are reduced last (``op``: as
    :func:`conccl.reduce_scatter_tensor`)."""
    local = group.local_steps.step(REDUCE_SCATTER, output, input, (op,), None, tp.stream_mode())
    timeout_s = _prepare(group, timeout)
    captured = group.executor.capturing()
    schedule, views = _agreed(group, local, timeout_s, captured)
    moved = moved_schedule(group, schedule, "gemm_then_scatter", (tp, rows, row_bytes),
                   lambda s: gemm_then_scatter(s, tp, rows, row_bytes))
    return _run(group, moved, input, output, async_op, timeout_s, views, compute, captured)
