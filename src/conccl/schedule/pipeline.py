"""Tensor-parallel pipelines as plain data: a collective's schedule with the GEMM cut into it.

In a tensor-parallel layer the collective feeds the GEMM (column-parallel: all-gather, then
GEMM) or the GEMM feeds the collective (row-parallel: GEMM, then reduce-scatter), so nothing
independent can hide it. What can: cutting both into pieces, so that each GEMM piece starts as
soon as its rows have landed, or each computed piece leaves while the next is computed (FiCCO,
arXiv 2512.10236; T3). A pipeline here is the group's *agreed* flat collective schedule (the
peers see a flat all-gather or reduce-scatter, checked and timed out like any call),
transformed by a pure function:

- each peer copy is cut into ``pieces`` row-aligned pieces; after a piece lands a
  :class:`~conccl.schedule.base.Mark` is written (all-gather), or before a piece leaves an
  :class:`~conccl.schedule.base.AwaitMark` holds its copy until the GEMM has computed it
  (reduce-scatter);
- one more slot runs the caller's GEMM as :class:`~conccl.schedule.base.Compute` steps of
  ``gemm_pieces`` landed pieces each, each behind the marks of the pieces it reads (or
  followed by the marks of the pieces it made).

Streams of an all-gather + GEMM, world 3, rank 0, direct order, 2 pieces per shard::

    slot 0 (control)  stage · (mark) · READY(s) -> 1, 2 ························ wait DONE(s)
    slot 1 (peer 1)   wait READY(s) of 1 · piece 1.0 · mark · piece 1.1 · mark · DONE(s) -> 1
    slot 2 (peer 2)   wait READY(s) of 2 · piece 2.0 · mark · piece 2.1 · mark · DONE(s) -> 2
    slot 3 (GEMM)     (await stage) · own rows · await 1.0 · rows 1.0 · await 2.0 · rows 2.0 · ...

(Above 64 MiB a shard's staging first waits for the peers' DONE of the previous call, and
the own rows' step waits for the staging, a same-GPU copy on SMs: a GEMM queued beside it
would take every SM first, holding the peers' pulls back a whole step. Smaller shards are
staged with no wait before, so the copy, queued first, starts first and the GEMM does not wait
for it; captured into a graph, where the staging waits for the peers' FREE and branches have
no order, the own step waits at any size. The flat all-gather's copy of the own chunk into
the output runs after the last step, or not at all: ``keep_own``.)

With ``gemm_streams=2`` (``direct-p2-s2``) the GEMM steps alternate over two slots, so a step
can start while the previous one's last wave still runs (own rows · await 2.0 · rows 2.0 ·
... on one, await 1.0 · rows 1.0 · await 1.1 · ... on the other).

Eagerly, every wait is a stream memory operation (``cuStreamWaitValue32`` on the CUDA
executor). In a CUDA graph a mark is an edge instead (an event recorded after its writer,
waited on before its awaiter: :func:`conccl.schedule.captured.mark_edges`), and the waits for the peers
right before a GEMM+reduce-scatter's sum are one spin-wait kernel
(:func:`conccl.executors.cuda.lowering.spin_before_reductions`). The schedule choice
(:class:`TPSchedule`, :mod:`conccl.schedule.tp_schedule`) is plain data too: the planner's
``auto`` picks one per shape (:mod:`conccl.planner.tp`).
"""
from __future__ import annotations

import dataclasses

from ..collectives.direct import number_slots, workspace_slot
from ..errors import InvalidArgument
from .base import (MARK_WORDS, Algorithm, AwaitMark, Buf, Compute, Copy, Mark, Phase, Reduce, ResetSignal, Schedule,
                   SetSignal, Signal, WaitSignal)
# The choice these pipelines are built from, named here too: callers of the pipelines import it here.
from .tp_schedule import SERIAL, Order, TPSchedule, gemm_steps, grouped_steps, piece_order, split_rows

__all__ = ["Order", "TPSchedule", "SERIAL", "split_rows", "gemm_steps", "gather_then_gemm", "gemm_then_scatter"]


def _check(schedule: Schedule, tp: TPSchedule, rows: int, row_bytes: int):
    world = schedule.world
    if rows <= 0 or row_bytes <= 0:
        raise InvalidArgument(f"a pipeline needs rows and row bytes > 0, got {rows} rows of {row_bytes} bytes")
    if world * min(tp.pieces, rows) > MARK_WORDS:
        raise InvalidArgument(f"{world} ranks x {tp.pieces} pieces exceed the {MARK_WORDS} marks a pad holds; "
                              "use fewer pieces")


def _word(peer: int, j: int, pieces: int) -> int:
    return peer * pieces + j


def _gemm_slots(steps: list, streams: int) -> list:
    """The GEMM steps' ops dealt round-robin over ``streams`` slots (step i on slot i % streams):
    each slot's steps stay in order, and a step waits only for its own pieces, not for the
    step before it on the other stream."""
    return [[op for step in steps[k::streams] for op in step] for k in range(streams)]


def gather_then_gemm(schedule: Schedule, tp: TPSchedule, rows: int, row_bytes: int, keep_own: bool = True,
                     captured: bool = False) -> Schedule:
    """An all-gather+GEMM pipeline from the agreed pull all-gather ``schedule`` of ``rows``
    rows of ``row_bytes`` bytes per rank (see the module doc). The GEMM slot computes the own
    rows first (read from the input; above 64 MiB once it is staged for the peers), then each
    step as its pieces land; in ``serial`` one GEMM over every row once
    all have landed. A pure function of plain data.

    The own chunk's copy into the output (a same-GPU copy: SM work) is for the caller only, as
    no pipelined GEMM step reads it: ``keep_own`` False drops it (the gathered output is not
    returned), True runs it after the last GEMM step. Where the flat schedule had it, in a
    slot of its own, it raced the GEMM steps for the SMs and, queued first, could hold the
    second step back by its whole length (measured: 0.1 ms of a 2.2 ms call on 2 x H200).
    ``captured``: the pipeline is captured into a CUDA graph, where its staging waits for the
    peers' FREE first (:mod:`conccl.schedule.captured`) and branches have no launch order: the own step
    waits for the staging at any size."""
    _check(schedule, tp, rows, row_bytes)
    if tp.push != (schedule.algorithm is Algorithm.STAGED_PUSH):
        raise InvalidArgument(f"the {tp.name} pipeline transforms a {tp.flat_algorithm().name} all-gather, "
                              f"not a {schedule.algorithm.name} one")
    if tp.push:
        return _push_then_gemm(schedule, tp, rows, row_bytes, keep_own, captured)
    rank, world = schedule.rank, schedule.world
    chunk = rows * row_bytes
    order = piece_order(world, rank, tp, rows)
    npieces = len(split_rows(rows, 1 if tp.serial else tp.pieces))
    own_copied = False  # a serial GEMM reads the own chunk from the output: after its copy
    own_copy = []  # a pipelined schedule's own-chunk copy, moved behind the GEMM steps
    staged = False  # the shard's staging (a same-GPU copy: SMs) waits on the peers first: the GEMM waits for it
    slots = []
    for ops in schedule.slots:
        out = []
        for op in ops:
            t = op.transfer if isinstance(op, Copy) else None
            waited = captured or any(isinstance(o, WaitSignal) for o in out)  # before the staging, on its slot
            if t is not None and t.phase is Phase.STAGE and not tp.serial and waited:
                out += [op, Mark(_word(rank, 0, npieces), rank)]
                staged = True
                continue
            if t is not None and t.phase is Phase.LOCAL and t.dst is Buf.OUTPUT:
                if tp.serial:
                    out += [op, Mark(_word(rank, 0, npieces), rank)]
                    own_copied = True
                elif keep_own:
                    own_copy.append(op)
                continue
            if t is None or t.phase is not Phase.PEER or t.dst is not Buf.OUTPUT or t.dst_rank != rank:
                out.append(op)
                continue
            p, within = divmod(t.dst_offset, chunk)
            if within or t.nbytes != chunk:
                raise InvalidArgument("gather_then_gemm cuts whole-shard pull copies; this schedule has others")
            for j, (a, b) in enumerate(split_rows(rows, npieces)):
                out.append(Copy(dataclasses.replace(t, src_offset=t.src_offset + a * row_bytes,
                                                    dst_offset=t.dst_offset + a * row_bytes, nbytes=(b - a) * row_bytes)))
                out.append(Mark(_word(p, j, npieces), p))
        slots.append(out)
    steps: list = []  # each GEMM step's ops: the waits for its pieces, then the step
    if tp.serial:
        # One GEMM reads every row from the output: the own chunk too, once copied there.
        awaits = [AwaitMark(_word(p, j, npieces), p) for p, j, _ in order]
        awaits += [AwaitMark(_word(rank, 0, npieces), rank)] if own_copied else []
        steps.append(awaits + [Compute(0, 0, world * rows)])
    else:
        # Where the staging copy sits behind a wait (a shard above 64 MiB: the whole workspace,
        # DONE of the previous call first), the own rows' step waits for it: the GEMM queued
        # beside it took every SM first and the copy (so the peers' pulls, so the next step)
        # waited for the step's end (measured on 2 x H200: a 0.33 ms gap in a 2.3 ms call;
        # async-TP issues its copy first for the same reason). Without a wait before it, the
        # copy is queued first and starts first (eagerly: a captured call waits at any size):
        # a wait would only add its latency (~10 us,
        # 6-8% of a decode-size call).
        wait_stage = [AwaitMark(_word(rank, 0, npieces), rank)] if staged else []
        steps.append(wait_stage + [Compute(0, rank * rows, (rank + 1) * rows, own=True)])
        for i, (start, end, pieces) in enumerate(grouped_steps(order, rows, tp.gemm_pieces), start=1):
            steps.append([AwaitMark(_word(p, j, npieces), p) for p, j in pieces] + [Compute(i, start, end)])
    gemm = _gemm_slots(steps, tp.gemm_streams)
    gemm[(len(steps) - 1) % len(gemm)] += own_copy  # after the last step, on its stream
    return dataclasses.replace(schedule, slots=number_slots(slots + gemm))


def _end_word(k: int) -> int:
    """The mark a push pipeline's GEMM slot ``k`` writes after its last step (the top words:
    the pieces' words are ``peer * pieces + j``, below ``world * pieces``)."""
    return MARK_WORDS - 1 - k


def _push_then_gemm(schedule: Schedule, tp: TPSchedule, rows: int, row_bytes: int, keep_own: bool,
                    captured: bool = False) -> Schedule:
    """An all-gather+GEMM pipeline from the agreed staged-push all-gather ``schedule``
    (``tp.push``): every rank's copy engines push its input into slot ``rank`` of each peer's
    workspace, gated by that peer's FREE (double-buffered) or READY (a whole workspace), and
    send DONE; here the control slot writes mark ``p`` as soon as peer ``p``'s DONE came, and
    the GEMM slot, which starts with the own rows from the input (nothing to wait for), runs
    peer ``p``'s rows from slot ``p`` of the workspace once that mark is in. The flat call's
    copies into the output (out of the workspace after the DONEs, and the own chunk's) are
    dropped; ``keep_own`` moves them behind the GEMM steps (same-GPU copies on SMs, which queued
    beside the steps would race them, as the pull pipelines' own-chunk copy did): each peer's
    copy-out after the last step of the GEMM slot that waited for that peer's mark, the own
    chunk's after the last step.

    One thing moves beside them: where the call takes the whole workspace (above
    :data:`~conccl.schedule.base.DOUBLE_BUFFER_MAX_BYTES`), its release (FREE to every peer, which
    lets a double-buffered call after it write into either half) waits for every GEMM slot's
    end mark, as the GEMM steps read the workspace after the control slot's last wait. A
    double-buffered call's release frees the other half, which no step of this call reads.
    ``captured``: a captured call's pushes wait for the FREE of the previous replay, which
    each rank sends last (:mod:`conccl.schedule.captured`), so it must come after every read of its
    region: it goes last on the GEMM slot of the last step (``captured.graph_schedule`` puts it
    there), which first waits for the other GEMM slot's end mark. Right behind the last GEMM
    on its own stream, not behind a mark another stream waits for: each hop between streams
    is a memory operation's latency on the call's critical path (the decode shape's whole
    GEMM is ~0.18 ms)."""
    rank, world = schedule.rank, schedule.world
    if world + tp.gemm_streams > MARK_WORDS:
        raise InvalidArgument(f"{world} ranks exceed the {MARK_WORDS - tp.gemm_streams} marks a push pipeline can use")
    slot_bytes = workspace_slot(rows * row_bytes)
    steps_rows = gemm_steps(world, rank, tp, rows)
    nslots = min(tp.gemm_streams, len(steps_rows))
    # a release to wait for (none at world 1): eagerly a whole call's; captured, the FREE a
    # free-gated call ends with (up to 64 MiB: a whole call's pushes wait for READY instead)
    releases = any(isinstance(op, SetSignal) and op.kind is Signal.FREE for op in schedule.slots[0])
    whole = releases and not schedule.double_buffered and not captured
    at_end = releases and captured and schedule.double_buffered
    outputs: list = []  # the flat call's copies into the output (keep_own): after the GEMM steps
    slots = []
    for k, ops in enumerate(schedule.slots):
        out: list = []
        for op in ops:
            t = op.transfer if isinstance(op, Copy) else None
            if t is not None and t.phase is Phase.LOCAL:
                outputs += [op] if keep_own else []
                continue
            if t is not None and (t.src, t.src_offset, t.nbytes) != (Buf.INPUT, 0, rows * row_bytes):
                raise InvalidArgument("a push pipeline cuts whole-shard pushes; this schedule has others")
            if whole and k == 0 and isinstance(op, SetSignal) and op.kind is Signal.FREE and not any(
                    isinstance(o, AwaitMark) for o in out):
                out += [AwaitMark(_end_word(g), rank) for g in range(nslots)]
            out.append(op)
            if k == 0 and isinstance(op, WaitSignal) and op.kind is Signal.DONE and op.seq_delta == 0:
                out.append(Mark(_word(op.peer, 0, 1), op.peer))
        slots.append(out)
    steps: list = []
    for i, (start, end, pieces) in enumerate(steps_rows):
        if not pieces:
            steps.append([Compute(i, start, end, own=True)])
            continue
        (p, _), = pieces
        steps.append([AwaitMark(_word(p, 0, 1), p), Compute(i, start, end, ws_offset=p * slot_bytes)])
    gemm = _gemm_slots(steps, nslots)
    for op in outputs:  # behind the step that read the rows it copies (which waited for them)
        t = op.transfer
        i = len(steps) - 1 if t.src is Buf.INPUT else next(
            i for i, (_, _, pieces) in enumerate(steps_rows) if pieces and pieces[0][0] * slot_bytes == t.src_offset)
        gemm[i % nslots].append(op)
    if whole:
        for g in range(nslots):
            gemm[g].append(Mark(_end_word(g), rank))
    if at_end:  # the last step's slot waits for the other's end; the FREE then follows there
        last = (len(steps) - 1) % nslots
        for g in range(nslots):
            if g != last:
                gemm[g].append(Mark(_end_word(g), rank))
                gemm[last].append(AwaitMark(_end_word(g), rank))
    return dataclasses.replace(schedule, slots=number_slots(slots + gemm))


def gemm_then_scatter(schedule: Schedule, tp: TPSchedule, rows: int, row_bytes: int) -> Schedule:
    """A GEMM+reduce-scatter pipeline from the agreed push reduce-scatter ``schedule`` whose
    output holds ``rows`` rows of ``row_bytes`` bytes per rank: the GEMM slot computes the rows
    bound for each peer in the order they leave (the next rank first, its own last), marking
    each piece; each piece's copy waits for its mark. The reduction (and the waits for the
    peers' pieces right before it) runs on the stream of the last GEMM step, right behind it:
    the own rows computed there need no mark, and the sum starts as that step ends instead
    of behind a mark crossing to the control stream (measured sooner at decode size on 2 x
    H200: docs/results.md, "The GEMM+reduce-scatter's tail, aligned timing, eager host time");
    own rows computed on another GEMM slot are awaited by their marks. In a CUDA graph the waits
    before the sum become one spin-wait kernel (:func:`conccl.executors.cuda.lowering.spin_before_reductions`).
    A pure function of plain data."""
    _check(schedule, tp, rows, row_bytes)
    if tp.push:
        raise InvalidArgument(f"{tp.name} is an all-gather+GEMM schedule; a GEMM+reduce-scatter already pushes")
    rank, world = schedule.rank, schedule.world
    chunk = rows * row_bytes
    order = piece_order(world, rank, tp, rows)
    npieces = len(split_rows(rows, 1 if tp.serial else tp.pieces))
    own = [(rank, j, cut) for j, cut in enumerate(split_rows(rows, npieces))]
    reduces = sum(isinstance(op, Reduce) for ops in schedule.slots for op in ops)  # one, from every flat plan
    slots, tail = [], None
    for ops in schedule.slots:
        out = []
        for op in ops:
            if isinstance(op, Reduce):
                if reduces != 1:  # each own mark must be awaited exactly once (a captured call resets it)
                    raise InvalidArgument(f"gemm_then_scatter takes a schedule of one reduction, not {reduces}")
                k = len(out)  # moved behind the last GEMM step with the waits right before it
                while k and isinstance(out[k - 1], (WaitSignal, ResetSignal)):
                    k -= 1
                tail = (out[k:] + [op], len(slots))
                del out[k:]
                continue
            if tail is not None and tail[1] == len(slots):  # what follows the reduction follows it still
                if not isinstance(op, (SetSignal, WaitSignal, ResetSignal)):  # a copy would lose its gate
                    raise InvalidArgument(f"gemm_then_scatter moves only signals behind the reduction, not {op}")
                tail[0].append(op)
                continue
            t = op.transfer if isinstance(op, Copy) else None
            if t is None or t.phase is not Phase.PEER or t.src is not Buf.INPUT or t.src_rank != rank:
                out.append(op)
                continue
            p, within = divmod(t.src_offset, chunk)
            if within or t.nbytes != chunk:
                raise InvalidArgument("gemm_then_scatter cuts whole-chunk push copies; this schedule has others")
            for j, (a, b) in enumerate(split_rows(rows, npieces)):
                out.append(AwaitMark(_word(p, j, npieces), p))
                out.append(Copy(dataclasses.replace(t, src_offset=t.src_offset + a * row_bytes,
                                                    dst_offset=t.dst_offset + a * row_bytes, nbytes=(b - a) * row_bytes)))
        slots.append(out)
    grouped = ([(0, world * rows, tuple((p, j) for p, j, _ in order + own))] if tp.serial
               else grouped_steps(order + own, rows, tp.gemm_pieces))
    last = (len(grouped) - 1) % tp.gemm_streams  # the GEMM slot of the last step (steps dealt round-robin)
    steps: list = []  # each GEMM step's ops: the step, then the marks of the pieces it made
    awaited = []  # own pieces made on another GEMM slot than the reduction's: awaited by mark
    for i, (start, end, pieces) in enumerate(grouped):
        marks = []
        for p, j in pieces:
            if tail is not None and p == rank and i % tp.gemm_streams == last:
                continue  # on the reduction's own stream: ordered before it, no mark
            marks.append(Mark(_word(p, j, npieces), p))
            if tail is not None and p == rank:
                awaited.append(AwaitMark(_word(p, j, npieces), p))
        steps.append([Compute(i, start, end)] + marks)
    gemm = _gemm_slots(steps, tp.gemm_streams)
    if tail is not None:
        gemm[last] += awaited + tail[0]
    slots += gemm
    return dataclasses.replace(schedule, slots=tuple(tuple(s) for s in slots if s))
