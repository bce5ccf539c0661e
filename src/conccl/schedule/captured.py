"""Collectives inside CUDA graphs: one captured schedule, replayed many times.

An eager call's signals carry its sequence number: a peer's word ``>= seq`` means "done with
call seq", so words never need resetting. A captured call cannot do that: a graph replays the
values it was captured with. A captured call therefore gets a *graph slot* of its own: its own
signal words (a block of every rank's pad beyond the eager words) and, where it needs one, its
own region of workspace, so nothing it touches is shared with another call. On those words:

* every signal writes 1, every wait waits for 1 and then writes 0 into the word it waited on
  (the waiter resets: each word is waited on exactly once per replay);
* the eager schedule's release (waits for the previous call's DONE, FREE writes: they
  double-buffer the shared workspace) is dropped, and every captured call instead ends with a
  wait for DONE from every peer: when it completes on a rank's stream, no peer touches that
  rank's memory any more, so the next replay, or any other call, may reuse it;
* a push into the peers' workspace (a reduce-scatter's, an all-reduce's, an all-gather's
  ``STAGED_PUSH``) waits for their FREE
  of the call's previous replay, which each rank sends every peer as its last op, after its
  DONE waits, when nothing reads or writes its region any more: the one-way signal that would
  otherwise gate the pushes (a READY of this replay, sent first) is off the critical path
  (the words start primed, as a staged pull's below). In every stream mode alike: a rank's
  mode is its own, and ranks of one call may differ.

A staged pull (an all-gather or all-to-all of plain tensors: peers read only this call's own
workspace region) does better: its end wait is the one-way signal that would sit between
every pair of captured calls, so it moves to the start of the *next* replay of the same call,
the only one that writes that region again. Each peer sends FREE after its copies instead of
DONE, and the call starts with a wait for FREE from every peer (and its reset) before its
staging copy. The first replay finds the words primed: every graph slot's FREE words are
set to :data:`GRAPH_VALUE` when the group's pad is made (:func:`primed_free_words`), and
after every complete replay they hold it again (each peer's last FREE is never consumed), so
a slot is primed whatever call of whatever kind held it before.

Why a reset can never erase the next replay's signal: every word's next write is causally
after its reset. A waiter resets before the operations that follow its wait; the writer's next
write of that word comes after the writer has waited, in the same or the next replay, for a
signal the waiter sends only after those operations (a READY after the end-of-call DONE, a
DONE after the copies that waited on READY or FREE, a PUSHED after a READY or FREE, a REDUCED
after the PUSHEDs, a FREE after the DONE waits). The CPU reference executor replays captured
calls across processes to check this (``tests/multiproc/test_graphs.py``).

A tensor-parallel pipeline's marks (:mod:`conccl.schedule.pipeline`: a piece landed or computed) are
the rank's own words: a captured pipeline uses its graph slot's own block of them (so graphs
replayed at once, or pipelines captured on forked streams, never share one), writes 1 and
resets each after its one wait, as the signal words are. The CUDA executor captures them as
graph edges instead (:func:`mark_edges`: an event recorded after the writer, waited on before
the awaiter; ``CONCCL_DISABLE=graph_mark_edges`` keeps the words), so no stream memory operation sits
between two GEMM steps. A capture that fails on one rank after the peers agreed it breaks the
group: they would replay it without that rank.

A one-stream call's own-shard copy (input to its own chunk of the output: no peer reads or
writes either) moves to a branch of its own, forked at the call's start and joined at its end
(:func:`_own_copy_forked`): in a graph the fork and the join are edges, free, and the copy
then runs beside the signals instead of between the last peer copy and the final wait, where
it added ~10 us to a 64 KiB all-gather on 2 x H100 (23.7 us against 14.1 in place).

What a replay cannot do: agree with the peers (shapes, dtypes and ops were checked once, at
capture; every rank must replay the same graphs in the same order) or time out (a peer that
never replays leaves the stream waiting; the watchdog sees only eager calls).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import env
from .base import (Algorithm, AwaitMark, Buf, Compute, Copy, Mark, Phase, ResetMark, ResetSignal, Schedule,
                       SetSignal, Signal, WaitSignal, signal_pad_words, signal_word)

# Captured calls a group can hold (graph slots); each takes one block of signal words.
GRAPH_SLOTS = 512
GRAPH_VALUE = 1  # what every captured signal writes and every captured wait waits for


def primed_free_words(world: int) -> list[int]:
    """Indices, in a pad, of every graph slot's FREE words (primed with :data:`GRAPH_VALUE`)."""
    words = signal_pad_words(world)
    return [words * (1 + slot) + signal_word(Signal.FREE, src, world) for slot in range(GRAPH_SLOTS)
            for src in range(world)]


def _staged_pull(schedule: Schedule) -> bool:
    """A double-buffered staged pull: peers read only the call's own workspace, and it ends
    with no wait for their DONE (see the module doc)."""
    return (schedule.staged and schedule.double_buffered and not any(
        isinstance(op, WaitSignal) and (op.kind is Signal.FREE or (op.kind is Signal.DONE and op.seq_delta == 0))
        for ops in schedule.slots for op in ops))


def graph_schedule(schedule: Schedule) -> Schedule:
    """``schedule`` as a captured call runs it (see the module doc): waits for the previous
    call dropped, a reset after every wait, DONE from every peer awaited at the end (a staged
    pull: FREE from every peer awaited at the start instead)."""
    world, rank = schedule.world, schedule.rank
    if schedule.parts:  # its buffers are many tensors by offset: conccl.group.parts refuses capture
        raise ValueError("a parts call (all_gather_into_parts, reduce_scatter_from_parts) cannot be captured")
    if _staged_pull(schedule):
        peers = [p for p in range(world) if p != rank]
        slots = []
        for ops in schedule.slots:
            out = []
            for op in ops:
                if isinstance(op, WaitSignal):
                    if op.seq_delta == 0:
                        out += [op, ResetSignal(op.peer, op.kind)]
                elif isinstance(op, SetSignal):
                    if op.kind is Signal.DONE:
                        out.append(SetSignal(op.peer, Signal.FREE))  # done reading the peer's region
                    elif op.kind is not Signal.FREE:
                        out.append(op)
                else:
                    out.append(op)
            slots.append(out)
        wait_free = [x for p in peers for x in (WaitSignal(p, Signal.FREE), ResetSignal(p, Signal.FREE))]
        slots[0][:0] = wait_free
        return Schedule(collective=schedule.collective, world=world, rank=rank,
                        slots=_own_copy_forked(_marks_reset(slots), schedule), algorithm=schedule.algorithm,
                        stream_mode=schedule.stream_mode, staged=schedule.staged,
                        workspace_bytes=schedule.workspace_bytes, one_shot=schedule.one_shot)
    slots = []
    pushes = False  # into the peers' workspace: READY of this replay stands in for FREE
    free_gated = _free_gated(schedule)  # ... or FREE of the previous replay does (module doc)
    for ops in schedule.slots:
        out = []
        for op in ops:
            if isinstance(op, WaitSignal):
                if op.kind is Signal.FREE:
                    pushes = True
                    kind = Signal.FREE if free_gated else Signal.READY
                    out += [WaitSignal(op.peer, kind), ResetSignal(op.peer, kind)]
                    continue
                if op.seq_delta != 0:
                    continue  # guards the previous call's use of shared memory: nothing is shared
                out += [op, ResetSignal(op.peer, op.kind)]
            elif isinstance(op, SetSignal):
                if op.kind is Signal.FREE:
                    continue  # the eager release: a captured call's region is its own
                if op.seq_delta != 0:
                    raise ValueError(f"a captured call cannot signal another call's number: {op}")
                out.append(op)
            else:
                out.append(op)
        slots.append(out)
    if pushes and not free_gated:
        slots[0][:0] = [SetSignal(p, Signal.READY) for p in range(world) if p != rank]
    awaited = {op.peer for ops in schedule.slots for op in ops
               if isinstance(op, WaitSignal) and op.kind is Signal.DONE and op.seq_delta == 0}
    for p in range(world):
        if p != rank and p not in awaited:
            slots[0] += [WaitSignal(p, Signal.DONE), ResetSignal(p, Signal.DONE)]
    if free_gated:
        # Last on slot 0, which holds every DONE wait and every read of this rank's region (the
        # other slots only push into the peers'): nothing touches the region any more. A push
        # pipeline's region is read by its GEMM steps instead: last on the slot of its last
        # step, which has waited for the other GEMM slot's end (conccl.schedule.pipeline). To every
        # peer, as every rank waits for every peer's FREE (an empty chunk's gate included).
        last = _free_slot(schedule) if _push_pipeline(schedule) else 0
        slots[last] += [SetSignal(p, Signal.FREE) for p in range(world) if p != rank]
    return Schedule(collective=schedule.collective, world=world, rank=rank,
                    slots=_own_copy_forked(_marks_reset(slots), schedule), algorithm=schedule.algorithm,
                    stream_mode=schedule.stream_mode, staged=schedule.staged, workspace_bytes=schedule.workspace_bytes)


def _marks_reset(slots) -> tuple:
    """``slots`` with a reset after every mark's wait (a pipeline's, :mod:`conccl.schedule.pipeline`): a
    captured call's marks write 1, and each is awaited once per call, so the next replay finds
    0 again (its marks are the pad's captured block: see :mod:`conccl.schedule.base`)."""
    return tuple(tuple(x for op in ops for x in ((op, ResetMark(op.word, op.peer)) if isinstance(op, AwaitMark)
                                                   else (op,))) for ops in slots)


def _free_gated(schedule: Schedule) -> bool:
    """Whether a captured call's pushes into the peers' workspace wait for the peers' FREE of
    the call's previous replay instead of their READY of this one (see the module doc): any
    such call in any stream mode (the mode is each rank's own, not agreed: ranks of one call
    may differ, so the protocol must not), a push all-gather+GEMM pipeline too (a peer may run
    the same agreed flat call as a plain ``STAGED_PUSH`` all-gather; its FREE goes behind its
    last GEMM step, whose slot has waited for the other GEMM slot's end: :mod:`conccl.schedule.pipeline`,
    :func:`_free_slot`), but
    not a one-shot call (one kernel, its own protocol) or a pull pipeline or a GEMM+reduce-
    scatter one (their marks order their copies), which every rank runs alike."""
    return (_reshapeable(schedule) or _push_pipeline(schedule)) and any(
        isinstance(op, WaitSignal) and op.kind is Signal.FREE for slot in schedule.slots for op in slot)


def _free_slot(schedule: Schedule) -> int:
    """The slot a captured push pipeline's FREE goes last on: the one running its last GEMM
    step (the highest ``Compute.index``), which must already wait for every other GEMM slot's
    final mark (the pipeline built with ``captured=True``); ValueError otherwise, as a FREE
    there would let a peer's next replay push into rows a GEMM step still reads."""
    gemm = [k for k, ops in enumerate(schedule.slots) if any(isinstance(op, Compute) for op in ops)]
    last = max((op.index, k) for k in gemm for op in schedule.slots[k] if isinstance(op, Compute))[1]
    awaited = {op.word for op in schedule.slots[last] if isinstance(op, AwaitMark)}
    for k in gemm:
        end = schedule.slots[k][-1]
        if k != last and not (isinstance(end, Mark) and end.word in awaited):
            raise ValueError("a captured push pipeline's last GEMM slot does not wait for the others' ends: build it "
                             "with gather_then_gemm(..., captured=True)")
    return last


def _push_pipeline(schedule: Schedule) -> bool:
    """A push all-gather+GEMM pipeline's (:func:`conccl.schedule.pipeline.gather_then_gemm`, ``push``)."""
    return schedule.algorithm is Algorithm.STAGED_PUSH and schedule.computes


def _reshapeable(schedule: Schedule) -> bool:
    """Neither one-shot (one kernel, its own protocol) nor a pipeline (its marks and GEMM steps
    order its copies): a call whose signals and copies may be regated or moved to a branch."""
    return not schedule.one_shot and not any(isinstance(op, (Compute, Mark, AwaitMark))
                                             for slot in schedule.slots for op in slot)


def _own_copy_forked(slots: tuple, schedule: Schedule) -> tuple:
    """``slots`` with a one-stream call's own-shard copies (Phase.LOCAL: the rank's input to its
    own output, which no peer touches) moved into a slot of their own, which the executor forks
    from the call's start and joins at its end (see the module doc). Nothing else moves: a
    pipeline's (its GEMM steps and marks order the copies) and a one-shot call's (one kernel)
    are left as they are, and so is a copy that is not the only thing of its kind."""
    if len(slots) != 1 or not _reshapeable(schedule):
        return slots
    ops = slots[0]
    own = [op for op in ops if _input_to_own_output(op)]
    if not own:
        return slots
    return tuple(op for op in ops if not _input_to_own_output(op)), tuple(Copy(op.transfer.in_slot(1)) for op in own)


def _input_to_own_output(op) -> bool:
    """An own-shard copy from the call's input to its output: nothing the call does reads its
    source (the input is never written) or its destination (the own chunk: peers write and read
    other chunks; in place, there is no such copy). Not an all-reduce's own piece, which copies
    the reduction's result out of the workspace after the reduction."""
    if not (isinstance(op, Copy) and op.transfer.phase is Phase.LOCAL):
        return False
    t = op.transfer
    return t.src is Buf.INPUT and t.dst is Buf.OUTPUT and t.src_rank == t.dst_rank


@dataclass(frozen=True)
class Segment:
    """A run of one stream slot's ops in a captured pipeline whose marks are graph edges
    (:func:`mark_edges`): the ``waits`` (mark words) come first, as waits on the events their
    writers recorded, then ``ops``, then an event recorded for each of ``records``."""

    slot: int
    ops: tuple
    waits: tuple = ()
    records: tuple = ()


def mark_edges_on() -> bool:
    """Whether a captured pipeline's marks are graph edges (:func:`mark_edges`), in captured
    calls and settled eager pipelines alike, unless ``CONCCL_DISABLE`` names ``graph_mark_edges``;
    then they stay stream memory operations on pad words (for comparing the two)."""
    return not env.disabled("graph_mark_edges")


def mark_edges(schedule: Schedule) -> list[Segment]:
    """A captured call's slots cut at its marks, in an order a capture may queue them: every
    mark that one of the call's own slots writes and another awaits (a pipeline's: a piece
    landed, a piece computed, a step ended) becomes an event recorded after the writer's ops and
    waited on before the awaiter's. Captured, an event's record and wait are an edge of the
    graph: no stream memory operation between two kernels (a mark written or awaited between
    two GEMM steps on one stream left ~5 us of the GPU idle at decode size), and no
    word to reset. The order: each slot's segments in turn, and every segment after those
    recording what it waits for (an event's wait follows its record in the order the host
    queues them); ValueError where none exists (a cycle, which would deadlock the GPU too).
    Marks not written exactly once in the call stay memory operations, with their resets."""
    writes = [op.word for ops in schedule.slots for op in ops if isinstance(op, Mark)]
    awaited = {op.word for ops in schedule.slots for op in ops if isinstance(op, AwaitMark)}
    edges = {w for w in awaited if writes.count(w) == 1}  # a word written twice keeps its memory ops
    per_slot: list[list[Segment]] = []
    for k, ops in enumerate(schedule.slots):
        segs: list[Segment] = []
        waits: list = []
        body: list = []
        records: list = []

        def close():
            if waits or body or records:
                segs.append(Segment(k, tuple(body), tuple(waits), tuple(records)))
            waits.clear(), body.clear(), records.clear()

        for op in ops:
            if isinstance(op, AwaitMark) and op.word in edges:
                if body or records:
                    close()
                waits.append(op.word)
            elif isinstance(op, ResetMark) and op.word in edges:
                continue  # an edge has no word to reset
            elif isinstance(op, Mark) and op.word in edges:
                records.append(op.word)
            else:
                if records:
                    close()
                body.append(op)
        close()
        per_slot.append(segs)
    order: list[Segment] = []
    done: set = set()
    nxt = [0] * len(per_slot)
    total = sum(map(len, per_slot))
    while len(order) < total:
        for k, segs in enumerate(per_slot):  # the first slot (lowest) whose next segment may go
            if nxt[k] < len(segs) and set(segs[nxt[k]].waits) <= done:
                seg = segs[nxt[k]]
                order.append(seg)
                done.update(seg.records)
                nxt[k] += 1
                break
        else:
            raise ValueError("a captured call's marks wait in a cycle: no order records every mark before its wait")
    return order
