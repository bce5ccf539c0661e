"""What a collective moves, as plain data.

A :class:`Schedule` is one rank's part of one collective call: the byte transfers it issues
and the signal operations that order them against its peers. It is produced by a pure
function of (world size, rank, sizes, splits, options) in ``conccl.collectives`` and run by an
executor (copy engines on CUDA, or the CPU reference executor in tests). Nothing here touches
a device.

Signal protocol (the same for every collective and both executors)
------------------------------------------------------------------
Every rank owns a small *signal pad* of 32-bit words that all peers can write. Word
``kind * world + src`` holds the latest sequence number that rank ``src`` has reported for
``kind``:

* ``READY``: ``src`` has done what must precede its peers' transfers of call ``seq``
  (for *pull*: its input is in peer-reachable memory; for *push*: its output may be written).
* ``DONE``: ``src`` has finished every transfer of call ``seq`` that touches the pad owner's
  memory (for *pull*: it has read the owner's buffer; for *push*: it has written into it).

Every call of every collective on a group takes the next sequence number, and every rank
writes DONE (and READY, where its collective's peers wait for it: not a double-buffered push)
to every peer in every call, even with zero bytes to move. Waits are
"word >= value", so a slow reader can never mistake an older call for the current one and
words never need resetting. Operations carry a ``seq_delta`` (0 = this call, -1 = the previous
call's number) so one schedule serves every call with the same shapes and can be cached.

A collective of two phases (the all-reduce: push, reduce, pull) orders its middle with two
more kinds, ``PUSHED`` and ``REDUCED``; DONE keeps its meaning (every transfer of the call
that touches the pad owner's memory is over), so any collective can follow any other.

The workspace is double-buffered for calls that need at most
:data:`DOUBLE_BUFFER_MAX_BYTES` of it (``Schedule.double_buffered``, where latency counts):
call ``seq`` uses half ``seq % 2`` of every rank's workspace (:func:`workspace_half`), so it
never waits for its predecessor to be done with the workspace, only for the one before that,
which in steady state finished long ago. That leaves one one-way signal on a call's critical
path where the data allows it:

* a staged pull (all-gather, all-to-all of plain tensors) stages into its own half and sends
  READY (the data is there); nothing guards the staging: the release below, run by this rank
  in call ``seq - 1``, already waited for every peer to be done with the half (DONE(seq-2));
* a push into the peers' workspace (reduce-scatter, all-reduce) needs no READY: it waits for
  ``FREE`` from the peer, which the peer sent during call ``seq - 1``.

``FREE`` (the *release*, :func:`release_ops`): in every call ``c`` each rank waits for DONE(c-1)
of every peer (they no longer touch the half call ``c - 1`` used, which call ``c + 1`` reuses;
its own use of it ended before call ``c`` began, in stream order) and then writes ``c`` into
its FREE word on every peer; a push of call ``s`` waits for FREE >= ``s - 1`` (0 for call 1,
whose half no call used before; call 2's waits for call 1's release, which a call taking the
whole workspace makes only at its end). Each
schedule places the release right after a wait that already implies DONE(c-1) (a peer's
READY(c) or PUSHED(c) is written after its DONE(c-1), in stream order, behind a fence), so
in steady state it waits for nothing and rides in a signal batch the call makes anyway.
A larger call uses the whole workspace (where copies take milliseconds, a signal is noise,
and a second half would cost memory): it waits for DONE(seq-1) of every peer before its
staging or its READY, pushes wait for READY, and it ends with DONE(seq) of every peer and
only then makes its release, so the calls on either side of it, of either kind, find the
workspace free. Why a fast rank cannot overwrite what a slow one still reads:
``tests/unit/test_protocol_interleavings.py`` runs every rank's schedules of mixed calls in
random orders (a slow rank, whole calls among double-buffered ones) and checks every read.

Marks (tensor-parallel pipelines, :mod:`conccl.schedule.pipeline`): after the signal words of every
graph slot, each pad has :data:`MARK_WORDS` words that only its own rank's streams write and
wait on. A :class:`Mark` says a piece has landed (all-gather) or been computed (before a
reduce-scatter sends it); an :class:`AwaitMark` holds a stream until it has. They too hold
the call's sequence number, so they never need resetting either. A captured pipeline uses its
graph slot's own block of :data:`MARK_WORDS` words, which no other call touches (an eager
word's old sequence number would satisfy a replay's wait at once, and two graphs may replay at
once): its marks write 1 and each wait resets its word (:class:`ResetMark`), every mark being
awaited exactly once per call. (The CUDA executor captures such marks as graph edges instead,
which touch no word: :func:`conccl.schedule.captured.mark_edges`.)
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Signal(enum.IntEnum):
    READY = 0
    DONE = 1
    # Two-phase collectives (all-reduce) only: between READY and DONE.
    PUSHED = 2   # src has written its part of call seq into the pad owner's workspace
    REDUCED = 3  # src's share of call seq's result is in src's own workspace, for peers to read
    # Written with seq during call seq: the pad owner may write into src's workspace half in
    # calls up to seq + 1 (see the module doc: double buffering).
    FREE = 4


NUM_SIGNAL_KINDS = len(Signal)


def signal_word(kind: Signal, src: int, world: int) -> int:
    """Index of the word in a rank's pad where ``src`` reports ``kind``."""
    return int(kind) * world + src


def signal_pad_words(world: int) -> int:
    return NUM_SIGNAL_KINDS * world


WORKSPACE_HALVES = 2  # the workspace is double-buffered (module doc)
# Calls needing at most this much workspace are double-buffered (module doc): what a 16 MiB
# collective needs with 8 ranks, where one signal is still a tenth of the call.
DOUBLE_BUFFER_MAX_BYTES = 64 << 20


def double_buffer(workspace_bytes: int) -> bool:
    """Whether a call needing ``workspace_bytes`` of workspace is double-buffered."""
    return 0 < workspace_bytes <= DOUBLE_BUFFER_MAX_BYTES


def workspace_half(seq: int, capacity: int) -> int:
    """Byte offset of the workspace half eager call ``seq`` uses in a workspace of
    ``capacity`` bytes (every rank's alike: the capacity is agreed)."""
    return (seq & 1) * (capacity // WORKSPACE_HALVES)


def release_ops(peers, done_awaited: bool = False) -> list:
    """The release every eager call makes (module doc): wait for DONE(seq-1) of every peer,
    then FREE (``seq``) to every peer. ``done_awaited``: the schedule waits for DONE(seq) of
    every peer before this point, which implies DONE(seq-1)."""
    waits = [] if done_awaited else [WaitSignal(p, Signal.DONE, -1) for p in peers]
    return waits + [SetSignal(p, Signal.FREE) for p in peers]


FREE_WAIT_DELTA = -1  # a push of call s waits for the peer's FREE >= s - 1 (module doc)


def mark_index(word: int, world: int, graph_slots: int, slot: int | None = None) -> int:
    """Index of mark ``word`` in a pad holding the eager words and ``graph_slots`` graph blocks:
    in the eager calls' block of marks, or (``slot``) in that graph slot's own block (a captured
    pipeline's: no other call, eager or captured, touches it)."""
    return signal_pad_words(world) * (1 + graph_slots) + (0 if slot is None else (1 + slot) * MARK_WORDS) + word


def pad_words(world: int, graph_slots: int) -> int:
    """Words of a pad: the eager signal words, a block per graph slot, the eager calls' marks and
    a block of marks per graph slot."""
    return mark_index(0, world, graph_slots) + (1 + graph_slots) * MARK_WORDS


class Buf(enum.Enum):
    """Buffers a transfer can name. Which rank's copy is meant is given beside it."""

    INPUT = "input"          # the caller's input tensor (a peer's only if symmetric)
    OUTPUT = "output"        # the caller's output tensor (a peer's only if symmetric)
    WORKSPACE = "workspace"  # the group's symmetric staging buffer


class Phase(enum.Enum):
    STAGE = "stage"  # local copy of the input into peer-reachable memory, before READY
    PEER = "peer"    # a transfer that reads or writes a peer's memory, after its READY
    LOCAL = "local"  # the rank's own shard, same GPU, kept off the critical path


@dataclass(frozen=True)
class Transfer:
    """One contiguous byte copy. ``src_rank``/``dst_rank`` say whose buffer is meant."""

    src_rank: int
    src: Buf
    src_offset: int
    dst_rank: int
    dst: Buf
    dst_offset: int
    nbytes: int
    slot: int
    phase: Phase

    def __post_init__(self):
        if self.nbytes <= 0 or self.src_offset < 0 or self.dst_offset < 0:
            raise ValueError(f"bad transfer {self}")

    def in_slot(self, slot: int) -> "Transfer":
        """This transfer on ``slot``: ``dataclasses.replace(self, slot=slot)`` at a fifth of its
        cost (every call of new sizes plans its schedule anew: host time)."""
        return Transfer(self.src_rank, self.src, self.src_offset, self.dst_rank, self.dst, self.dst_offset,
                        self.nbytes, slot, self.phase)


@dataclass(frozen=True)
class Copy:
    transfer: Transfer


@dataclass(frozen=True)
class SetSignal:
    """Write ``seq + seq_delta`` into word (kind, self) of ``peer``'s pad, after prior work."""

    peer: int
    kind: Signal
    seq_delta: int = 0


@dataclass(frozen=True)
class WaitSignal:
    """Block the slot until word (kind, peer) of the own pad is >= ``seq + seq_delta``."""

    peer: int
    kind: Signal
    seq_delta: int = 0


@dataclass(frozen=True)
class ResetSignal:
    """Write 0 into word (kind, ``peer``) of the own pad, after prior work: a captured call's
    consumer-side reset after its wait (see :mod:`conccl.schedule.captured`), never in an eager schedule."""

    peer: int
    kind: Signal


ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # the reduction's dtypes


@dataclass(frozen=True)
class Reduce:
    """Elementwise reduction on this rank's GPU: ``dst = sum(scale * src for src in srcs)``.

    ``srcs`` are (buffer, byte offset) of this rank's own buffers, summed in the order given,
    accumulated in fp32 and rounded to ``dtype`` once; ``nbytes`` per operand. The one op of a
    schedule that needs an SM (a small kernel on CUDA), run after the copies it depends on.
    """

    dst: tuple  # (Buf, byte offset)
    srcs: tuple  # ((Buf, byte offset), ...)
    nbytes: int
    dtype: str  # "bfloat16", "float16" or "float32"
    scale: float = 1.0  # every operand is multiplied by it first (AVG: 1/world; PREMUL_SUM: the factor)
    # Whose buffer each operand is (None: all this rank's own). Only a one-shot schedule
    # (Schedule.one_shot) reads peers' operands: the kernel loads them over NVLink.
    src_ranks: tuple[int, ...] | None = None
    # The result's dtype where it is wider than the operands' (bf16 or fp16 operands summed into
    # fp32: FSDP2's reduce_dtype=float32 over bf16 gradients, with no cast copy before); None:
    # ``dtype``. The arithmetic is the same: operands widened exactly, fp32 sum, no rounding.
    out_dtype: str | None = None

    @property
    def out_bytes(self) -> int:
        """Bytes written at ``dst``: ``nbytes`` where the result has the operands' dtype."""
        if self.out_dtype is None or self.out_dtype == self.dtype:
            return self.nbytes
        return self.nbytes // ELEMENT_BYTES[self.dtype] * ELEMENT_BYTES[self.out_dtype]


def max_slots(world: int) -> int:
    """The most stream slots any schedule of ``world`` ranks has (executors make that many
    streams): one per peer, a control slot, the own chunk's copy, and in a pipeline
    (:mod:`conccl.schedule.pipeline`) up to two GEMM slots (which take the own copy's place: world + 2
    at most today; one spare)."""
    return world + 3


# Words per pad for marks: a pipeline's pieces (world x pieces per shard) each take one. A pad
# holds two blocks of them: the eager calls', then the captured calls' (conccl.schedule.captured).
MARK_WORDS = 256


@dataclass(frozen=True)
class _MarkWord:
    word: int
    peer: int

    def __post_init__(self):
        if not 0 <= self.word < MARK_WORDS:
            raise ValueError(f"mark word {self.word} outside 0..{MARK_WORDS - 1}")


@dataclass(frozen=True)
class Mark(_MarkWord):
    """Write ``seq`` into the own pad's mark ``word`` after prior work on the slot: the piece
    it names is in place (landed from ``peer``, or computed for ``peer``)."""


@dataclass(frozen=True)
class AwaitMark(_MarkWord):
    """Block the slot until the own pad's mark ``word`` is >= ``seq`` (its piece, from or for
    ``peer``, is in place)."""


@dataclass(frozen=True)
class ResetMark(_MarkWord):
    """Write 0 into the own pad's mark ``word``, after prior work: a captured pipeline's reset
    after its wait (see :mod:`conccl.schedule.captured`), never in an eager schedule."""


@dataclass(frozen=True)
class Compute:
    """Run the caller's computation on rows ``[row_start, row_end)`` on the slot's stream: the
    executor hands this op to the ``compute`` callable the call brought (a GEMM of those rows;
    ``own``: they are the rank's own shard, read from its input). The one op whose work is not
    a schedule's own: its time, SMs and memory are the caller's GEMM's.

    ``ws_offset``: the rows are read from the call's workspace at this byte offset (a push
    pipeline's: the peers pushed them there, :mod:`conccl.schedule.pipeline`), not from the output; the
    executor calls ``compute(op, workspace)`` with the call's workspace region (its half, or
    a captured call's own region) as a uint8 tensor on this rank."""

    index: int
    row_start: int
    row_end: int
    own: bool = False
    ws_offset: int | None = None

    def __post_init__(self):
        if not 0 <= self.row_start < self.row_end:
            raise ValueError(f"bad compute rows [{self.row_start}, {self.row_end})")
        if self.ws_offset is not None and (self.own or self.ws_offset < 0):
            raise ValueError(f"bad compute workspace offset {self.ws_offset} (own rows: {self.own})")


Op = Copy | SetSignal | WaitSignal | ResetSignal | Reduce | Mark | AwaitMark | ResetMark | Compute


@dataclass(frozen=True)
class Schedule:
    """One rank's program for one call: ``slots[k]`` is an ordered list run on stream slot k.

    Slots are independent except through signals; every slot starts after the work already
    queued on the caller's stream, and the caller's stream waits for all slots at the end.
    ``algorithm``, ``stream_mode`` and ``staged`` say how it was built (the executor issues a
    BATCH schedule's peer copies as one batch). ``workspace_bytes`` is how much of the group's symmetric workspace every rank needs.
    """

    collective: str
    world: int
    rank: int
    slots: tuple[tuple[Op, ...], ...]
    algorithm: Algorithm
    stream_mode: StreamMode
    staged: bool
    workspace_bytes: int = 0
    # The own input (reduce_scatter.from_parts) or output (all_gather.into_parts) is several
    # tensors, named by byte offset from the lowest one: an executor reaches them by address.
    parts: bool = False
    # Its workspace is half seq % 2 of the group's (module doc); it needs twice workspace_bytes.
    double_buffered: bool = False
    # The whole call is one small SM kernel (conccl.collectives.one_shot): the CUDA executor
    # runs its ops as one launch, the reference executor one by one.
    one_shot: bool = False

    @property
    def workspace_need(self) -> int:
        """Bytes of group workspace this call needs mapped (both halves if double-buffered)."""
        return self.workspace_bytes * (WORKSPACE_HALVES if self.double_buffered else 1)

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(op.transfer for ops in self.slots for op in ops if isinstance(op, Copy))

    @property
    def num_slots(self) -> int:
        return len(self.slots)

    @property
    def computes(self) -> bool:
        """Whether the schedule runs the caller's computation (a pipeline: :mod:`conccl.schedule.pipeline`)."""
        return any(isinstance(op, Compute) for ops in self.slots for op in ops)



class Algorithm(enum.Enum):
    """Direction of peer transfers over the full NVLink mesh."""

    PULL = "pull"  # each rank reads its peers' (symmetric) inputs into its own output
    PUSH = "push"  # each rank writes its input into its peers' (symmetric) outputs
    # each rank writes its input into its peers' workspace and copies what landed in its own into
    # its output: one signal (the pushes' DONE) on the critical path, the workspace freed for the
    # next call off it (an all-gather's; a reduce-scatter's and an all-reduce's push is this)
    STAGED_PUSH = "staged_push"


class StreamMode(enum.Enum):
    """How transfers map to CUDA streams (and so to copy engines)."""

    PER_PEER = "per_peer"  # one stream per peer: transfers to different peers run at once
    SINGLE = "single"      # everything on one stream, one cudaMemcpyAsync after another
    BATCH = "batch"        # one stream, the peer copies issued as one cudaMemcpyBatchAsync


def awaited_peers(schedule: Schedule, seq: int, pad, world: int) -> list[int]:
    """Peers named by a wait of ``schedule`` (call ``seq``) that ``pad`` does not satisfy yet.

    Compared as the GPU does (``cuStreamWaitValue32`` GEQ: ``(int32)(word - value) >= 0``).
    """
    missing = set()
    for ops in schedule.slots:
        for op in ops:
            if isinstance(op, WaitSignal):
                diff = (int(pad[signal_word(op.kind, op.peer, world)]) - (seq + op.seq_delta)) & 0xFFFFFFFF
                if diff >= 1 << 31:
                    missing.add(op.peer)
    return sorted(missing)
