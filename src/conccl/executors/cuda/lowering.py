"""A Schedule lowered into the driver calls that will run it: pure, tested on CPU.

Consecutive signal operations of a slot become one ``cuStreamBatchMemOp`` (waits and writes in
order, as the separate calls ran), and the peer copies of a BATCH schedule one
``cuMemcpyBatchAsync``. A small own-shard copy joins that batch (:func:`hoist_small_local`). A
4-rank push all-gather of 1 MiB is then 3 driver calls instead of 16. :mod:`.program` compiles
the lowered steps into prebuilt driver calls.

Lowered form of one slot: a tuple of steps, each one driver call, typed by the call it
becomes (named tuples of plain values: what the tests compare):
* :class:`SignalBatch`: one ``cuStreamBatchMemOp`` of :class:`SignalStep` s, in order;
* :class:`SignalStep`: one ``cuStreamWaitValue32`` (``is_wait``: "word >= seq + seq_delta" on
  the own pad) or ``cuStreamWriteValue32`` (``seq + seq_delta`` into a peer's pad, with a fence
  before it), where the driver does not take that op in a batch;
* :class:`CopyStep`: one ``cuMemcpyAsync``;
* :class:`CopyBatch`: one ``cuMemcpyBatchAsync`` of :class:`CopyStep` s;
* :class:`ReduceStep`: one launch of the bounded reduction kernel
  (:mod:`conccl.kernels.reduce`), the only SM work of any collective's schedule;
* :class:`ComputeStep`: the caller's computation (a pipeline's GEMM step,
  :mod:`conccl.schedule.pipeline`), handed back to the caller's ``compute`` on the slot's stream;
* :class:`SpinWaitStep`: one launch of the one-warp spin-wait kernel
  (:mod:`conccl.kernels.spin`) in place of the stream memory waits right before a
  reduction, where ``spin`` asks for it (:func:`spin_before_reductions`).

A pipeline's marks (:class:`~conccl.schedule.base.Mark`, :class:`~conccl.schedule.base.AwaitMark`) are
signal steps on the own pad's mark words (``marks``: their base address).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from ...schedule.base import (AwaitMark, Buf, Compute, Copy, Mark, Phase, Reduce, ResetMark, ResetSignal, Schedule,
                              SetSignal, Signal, StreamMode, WaitSignal, signal_word)

# cuStreamBatchMemOp takes fewer than 256 operations per call.
MAX_SIGNALS_PER_BATCH = 255
# An own-shard copy up to this size rides in the peer-copy batch before it (see hoist_small_local).
HOIST_LOCAL_MAX_BYTES = 1 << 20


class SignalStep(NamedTuple):
    """A wait on the own pad or a write into a peer's: one driver call, or one op of a batch."""

    is_wait: bool
    address: int  # the signal word's
    seq_delta: int  # waits for, or writes, the call's sequence number plus this


class SignalBatch(NamedTuple):
    signals: tuple[SignalStep, ...]


class CopyStep(NamedTuple):
    """A copy of ``nbytes`` from ``src`` to ``dst``: one driver call, or one copy of a batch."""

    dst: int
    src: int
    nbytes: int


class CopyBatch(NamedTuple):
    copies: tuple[CopyStep, ...]


class ReduceStep(NamedTuple):
    """``dst = sum(scale * src for src in srcs)`` over ``nbytes`` each, in ``dtype``."""

    dst: int
    srcs: tuple[int, ...]
    nbytes: int
    dtype: str
    scale: float
    out_dtype: str | None = None  # fp32 over 16-bit operands (Reduce.out_dtype)


class SpinWaitStep(NamedTuple):
    """The waits before a reduction as one launch of the spin-wait kernel: each word of the own
    pad ``>= seq + delta``; ``abort_word``: the own pad's spin words (the watchdog's abort, then
    the kernel's timeout flag)."""

    words: tuple[tuple[int, int], ...]  # (address, seq_delta)
    abort_word: int


class OneShotStep(NamedTuple):
    """A whole one-shot call (``Schedule.one_shot``) as one launch of the one-CTA kernel
    (:mod:`conccl.kernels.one_shot`): plain values, every address resolved."""

    kind: str  # "gather" or "reduce" (conccl.kernels.one_shot.KINDS)
    dtype: str  # the reduction's (a gather's is ignored)
    scale: float
    graph: bool  # a captured call: signals write 1, waits reset (conccl.schedule.captured)
    rank: int
    world: int
    staged: tuple[int, ...]  # every rank's staged input, as this rank reaches it
    signal_to: tuple[int, ...]  # READY words in the peers' pads (own entry unused)
    done_to: tuple[int, ...]  # DONE words (FREE in a graph)
    free_to: tuple[int, ...]  # the eager release's FREE words
    wait_signal: tuple[int, ...]  # the own pad's READY words
    wait_done: tuple[int, ...]
    wait_free: tuple[int, ...]
    src_off: tuple[int, ...]  # per rank (a reduction: entry 0 for every rank)
    dst_off: tuple[int, ...]
    nbytes: tuple[int, ...]
    input: int
    output: int
    stage_bytes: int
    abort_word: int  # the own pad's spin words: the watchdog's abort, the kernel's timeout flag
    timed_out_word: int


def lower_one_shot(schedule: Schedule, address: Callable[[int, object], int], pads: list[int],
                   spin_words: int) -> tuple:
    """A one-shot schedule (one slot: stage, own piece, READY, the peers' pieces or the
    reduction, DONE, the release; as a captured call, with resets and FREE) as one
    :class:`OneShotStep`; ``spin_words``: the address of the own pad's abort word."""
    world, rank = schedule.world, schedule.rank
    (ops,) = schedule.slots
    graph = any(isinstance(op, ResetSignal) for op in ops)
    src_off, dst_off, nbytes = [0] * world, [0] * world, [0] * world
    stage_bytes, kind, dtype, scale = 0, "gather", "float32", 1.0
    for op in ops:
        if isinstance(op, Copy):
            t = op.transfer
            if t.phase is Phase.STAGE:
                stage_bytes = t.nbytes
            else:  # the own piece (from the input) or a peer's (from its staged input)
                src_off[t.src_rank], dst_off[t.src_rank], nbytes[t.src_rank] = t.src_offset, t.dst_offset, t.nbytes
        elif isinstance(op, Reduce):
            if op.out_dtype not in (None, op.dtype):
                raise TypeError(f"{op!r}: the one-shot kernel sums into the operands' dtype only")
            kind, dtype, scale = "reduce", op.dtype, op.scale
            src_off[0], dst_off[0], nbytes[0] = op.srcs[0][1], op.dst[1], op.nbytes

    def words(on_peer: bool, kind_):
        return tuple(0 if p == rank else (pads[p] + 4 * signal_word(kind_, rank, world) if on_peer
                                          else pads[rank] + 4 * signal_word(kind_, p, world)) for p in range(world))

    return (OneShotStep(kind, dtype, scale, graph, rank, world,
                        # every rank's, even where this one stages nothing (an all-to-all it only receives in)
                        tuple(address(q, Buf.WORKSPACE) if schedule.workspace_bytes else 0 for q in range(world)),
                        words(True, Signal.READY), words(True, Signal.FREE if graph else Signal.DONE),
                        words(True, Signal.FREE), words(False, Signal.READY), words(False, Signal.DONE),
                        words(False, Signal.FREE), tuple(src_off), tuple(dst_off), tuple(nbytes),
                        address(rank, Buf.INPUT), address(rank, Buf.OUTPUT), stage_bytes, spin_words,
                        spin_words + 4),)


class ComputeStep(NamedTuple):
    """The caller's computation for ``op`` (a :class:`~conccl.schedule.base.Compute`), queued by the
    caller on the slot's stream: no driver call of ours."""

    op: Compute


def _is_small_local(op) -> bool:
    return isinstance(op, Copy) and op.transfer.phase is Phase.LOCAL and op.transfer.nbytes <= HOIST_LOCAL_MAX_BYTES


def hoist_small_local(ops) -> list:
    """``ops`` with each small own-shard copy moved up next to the peer copies before it.

    Schedules put the own shard (a same-GPU copy) after the DONE signals, off the critical
    path. When it is small, the driver call it costs (~4 us of host time) is worth more than
    the GPU time it adds to the peer-copy batch (< 1 us at 1 MiB), so it joins that batch.
    Only signal *writes* are stepped over: the own shard touches only this rank's own memory,
    which no peer reads or writes, so moving it before them changes nothing but timing.
    """
    out = list(ops)
    joined = set()  # own copies now in the peer-copy batch: the next one may join behind them
    for i, op in enumerate(out):
        if not _is_small_local(op):
            continue
        j = i
        while j > 0 and isinstance(out[j - 1], SetSignal):
            j -= 1
        prev = out[j - 1] if j > 0 else None
        behind_batch = isinstance(prev, Copy) and (prev.transfer.src_rank != prev.transfer.dst_rank or id(prev) in joined)
        if behind_batch and (j < i or id(prev) in joined):
            out.insert(j, out.pop(i))
            joined.add(id(op))
    return out


def _reads_written(copy: "CopyStep", earlier: "CopyStep") -> bool:
    """Whether ``copy`` reads bytes that ``earlier`` writes."""
    return copy.src < earlier.dst + earlier.nbytes and earlier.dst < copy.src + copy.nbytes


class _Spin(NamedTuple):
    waits: tuple  # WaitSignal ops, waited for by one spin-wait kernel


def spin_before_reductions(ops, max_waits: int = 8) -> list:
    """``ops`` with each run of signal waits (and a captured call's resets of the words waited
    on) right before a reduction made one spin wait (:class:`_Spin`), and the resets moved
    behind the reduction.

    Why there only: a kernel polling the word wakes ~4 us sooner than a stream memory wait
    (2 x H100: 5.6 against 9.9 us one way in a graph, docs/results.md),
    and that gain survives where SM work follows the wait (a copy queued behind a kernel starts
    ~1.5 us later than behind a memop, which ate it); the reduction takes an SM anyway. The
    same words and values as the waits: the protocol is unchanged, and ranks may differ. A
    reset (write 0 into the own word just waited on) may move behind the reduction: the peer
    writes that word again only after a signal this rank sends after both (conccl.schedule.captured)."""
    out: list = []
    k = 0
    while k < len(ops):
        j = k
        while j < len(ops) and isinstance(ops[j], (WaitSignal, ResetSignal)):
            j += 1
        run = ops[k:j]
        waits = tuple(op for op in run if isinstance(op, WaitSignal))
        resets = [op for op in run if isinstance(op, ResetSignal)]
        if (j < len(ops) and isinstance(ops[j], Reduce) and 1 <= len(waits) <= max_waits
                and {(r.peer, r.kind) for r in resets} <= {(w.peer, w.kind) for w in waits}):
            out += [_Spin(waits), ops[j], *resets]
            k = j + 1
        else:
            out += run if run else [ops[k]]
            k = j if run else k + 1
    return out


def lower_slot(ops, address: Callable[[int, object], int], pads: list[int], rank: int, world: int,
               batch_copies: bool, batching: str = "all", marks: int | None = None,
               spin_words: int | None = None) -> tuple:
    """Lower one slot's ops to driver steps. ``address(rank, buf)`` is a buffer's base
    address as this rank reaches it; ``pads[r]`` the address of rank r's signal pad;
    ``marks`` the address of the own pad's first mark word (a pipeline's only).
    ``batching``: which signal ops may share a ``cuStreamBatchMemOp`` ("all", "waits" or
    "none"; what the driver accepts is probed once per group, see :func:`probe_batching`).
    ``spin_words``: the own pad's spin words; given, the waits right before a reduction are
    one spin-wait kernel (:func:`spin_before_reductions`), else stream memory waits."""
    steps: list = []
    signals: list = []
    copies: list = []
    with_peers = False  # the copy batch under way holds peer copies
    if batch_copies:
        ops = hoist_small_local(ops)
    if spin_words is not None:
        ops = spin_before_reductions(ops)

    def flush_signals():
        for i in range(0, len(signals), MAX_SIGNALS_PER_BATCH):
            steps.append(SignalBatch(tuple(signals[i:i + MAX_SIGNALS_PER_BATCH])))
        signals.clear()

    def flush_copies():
        nonlocal with_peers
        if copies:
            # own copies alone: a batch of one is a plain copy
            steps.append(copies[0] if len(copies) == 1 and not with_peers else CopyBatch(tuple(copies)))
            copies.clear()
        with_peers = False

    for op in ops:
        if isinstance(op, Copy):
            flush_signals()
            t = op.transfer
            copy = CopyStep(address(t.dst_rank, t.dst) + t.dst_offset, address(t.src_rank, t.src) + t.src_offset,
                            t.nbytes)
            if not batch_copies:
                steps.append(copy)
                continue
            peer = t.src_rank != t.dst_rank
            # A peer copy does not join a batch of own copies; a large own copy does not join the
            # peer copies' batch (it would hold back what waits for that batch); a run of own
            # copies (a reduce-scatter from parts: one per parameter) is one batch of its own.
            if copies and (with_peers != peer) and (peer or not _is_small_local(op)):
                flush_copies()
            elif any(_reads_written(copy, c) for c in copies):
                # a batch's copies may run in any order: one that reads what another writes
                # (an own chunk read back from where this rank's push put it) starts a new one
                flush_copies()
            with_peers |= peer
            copies.append(copy)
            continue
        flush_copies()
        if isinstance(op, Compute):
            flush_signals()
            steps.append(ComputeStep(op))
            continue
        if isinstance(op, _Spin):
            flush_signals()
            steps.append(SpinWaitStep(tuple((pads[rank] + 4 * signal_word(w.kind, w.peer, world), w.seq_delta)
                                            for w in op.waits), spin_words))
            continue
        if isinstance(op, Reduce):
            if op.src_ranks is not None:
                raise TypeError(f"{op!r}: peers' operands are a one-shot schedule's, lowered as one kernel")
            flush_signals()
            steps.append(ReduceStep(address(rank, op.dst[0]) + op.dst[1],
                                    tuple(address(rank, b) + off for b, off in op.srcs), op.nbytes, op.dtype, op.scale,
                                    op.out_dtype))
            continue
        if isinstance(op, WaitSignal):
            signal = SignalStep(True, pads[rank] + 4 * signal_word(op.kind, op.peer, world), op.seq_delta)
        elif isinstance(op, SetSignal):
            signal = SignalStep(False, pads[op.peer] + 4 * signal_word(op.kind, rank, world), op.seq_delta)
        elif isinstance(op, ResetSignal):  # a captured call, launched as call 1: writes 1 - 1 = 0
            signal = SignalStep(False, pads[rank] + 4 * signal_word(op.kind, op.peer, world), -1)
        elif isinstance(op, (Mark, AwaitMark, ResetMark)):
            if marks is None:
                raise TypeError(f"{op!r}: a pipeline's mark, lowered without the pad's mark words")
            # a reset: a captured call's, launched as call 1: writes 1 - 1 = 0
            signal = SignalStep(isinstance(op, AwaitMark), marks + 4 * op.word, -1 if isinstance(op, ResetMark) else 0)
        else:
            raise TypeError(f"unknown schedule op {op!r}")
        if batching == "all" or (batching == "waits" and signal.is_wait):
            signals.append(signal)
        else:  # a batch of one: the plain cuStreamWaitValue32 / cuStreamWriteValue32
            flush_signals()
            steps.append(signal)
    flush_signals()
    flush_copies()
    return tuple(steps)


def lower(schedule: Schedule, address: Callable[[int, object], int], pads: list[int], batching: str = "all",
          batch_copies: bool | None = None, marks: int | None = None, spin_words: int | None = None,
          spin: bool = False) -> tuple:
    """Every slot of ``schedule`` lowered (see :func:`lower_slot`); ``batch_copies`` None: as
    its stream mode says (a captured call passes False: cuMemcpyBatchAsync cannot be captured).
    A one-shot schedule is one kernel launch (:func:`lower_one_shot`). ``spin``: the waits
    right before a reduction are a spin-wait kernel (needs ``spin_words``)."""
    if spin and spin_words is None:
        raise TypeError("spin waits lowered without the pad's spin words")
    if schedule.one_shot:
        if spin_words is None:
            raise TypeError("a one-shot schedule lowered without the pad's spin words")
        return (lower_one_shot(schedule, address, pads, spin_words),)
    batch = schedule.stream_mode is StreamMode.BATCH if batch_copies is None else batch_copies
    return tuple(lower_slot(ops, address, pads, schedule.rank, schedule.world, batch, batching, marks,
                            spin_words if spin else None)
                 for ops in schedule.slots)


def shape(lowered: tuple) -> tuple:
    """What a compiled program holds besides the buffers' addresses and sizes: two lowerings of
    one shape differ only in their copies' and reductions' operands (CompiledProgram.readdressed)."""
    def one(step):
        if isinstance(step, CopyStep):
            return CopyStep
        if isinstance(step, CopyBatch):
            return CopyBatch, len(step.copies)
        if isinstance(step, ReduceStep):
            return ReduceStep, len(step.srcs), step.dtype, step.scale, step.out_dtype
        return step

    return tuple(tuple(map(one, steps)) for steps in lowered)
