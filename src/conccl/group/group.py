"""A Group: one process group's conccl state, and the front end every executor shares.

A :class:`Group` owns everything conccl keeps for one process group (its host board, its
executor with the signal pads, workspace and peer-reachable allocations, its watchdog, its
persistent ops and whatever an upper layer attaches with :meth:`Group.resource`) and
releases all of it in :meth:`Group.close`. Its calls are generic over
:class:`~conccl.collectives.base.Collective`: a collective says how to validate, check and
plan; the group does the rest, the same for every collective.

A call goes through four steps, the first three on the host and before anything is queued:

1. validate the local arguments (a bad call raises and leaves the output untouched);
2. publish what this rank is about to do on the group's host board and read every peer's
   entry: collective, dtype, sizes or splits, whether its tensors are peer-reachable. A peer
   that disagrees is named in the error instead of bytes being moved, and every rank derives
   the same decisions (staging, algorithm, workspace size) from the same rows. A call that
   repeats a settled one only *posts* its entry and takes the last rows' plan; the peers'
   entries are compared at its next call (``Options.post_settled``, :func:`_plan_own`);
3. plan: a pure, cached function of sizes and options gives the rank's :class:`Schedule`;
4. execute it on the executor (copy engines on CUDA, shared memory in the CPU reference).

Failure handling (a dead, late or mismatched peer): step 2 is bounded by the call's timeout
and notices a peer whose process exited; a mismatch raises on every rank before anything
moves and leaves the group usable, but where a rank had posted the call (it ran on rows some
rank did not have): that breaks the group, found at the next call. Once queued, a CUDA call is watched by the group's
:class:`~conccl.group.watchdog.Watchdog`. A timeout, on the host or the GPU, *breaks* the group:
the cause is posted on the board for the peers, the GPU's stream waits are released, and
every later call raises :class:`~conccl.errors.GroupBroken` at once with the original cause.
"""
from __future__ import annotations

import logging
import os
from argparse import ArgumentTypeError
import threading
import weakref
import zlib
from dataclasses import dataclass
from dataclasses import field as _field
from datetime import timedelta

import numpy as np
import torch

from .board import ABORT_EXITED, ABORT_OTHER, ABORT_TIMEOUT, HostBoard, PostedMismatch
from ..collectives import REGISTRY, Collective, LocalCall, PeerCalls
from ..collectives.one_shot import one_shot_plan
from ..collectives.reduce_scatter import reduce_op
from ..errors import CollectiveError, CollectiveTimeout, GroupBroken, InvalidArgument
from ..units import parse_size
from ..schedule.captured import GRAPH_SLOTS, graph_schedule
from .persistent import PersistentCollective
from ..schedule.base import DOUBLE_BUFFER_MAX_BYTES, Algorithm, Buf, Copy, Schedule, StreamMode
from .watchdog import Flight, Watchdog
from . import parts as parts_mod
from .methods import CollectiveMethods
from .work import ONE_SHOT, Work

_log = logging.getLogger("conccl")

DEFAULT_TIMEOUT = timedelta(minutes=10)  # torch.distributed's default for NCCL groups

# Row published on the host board: fixed fields, then input and output split bytes per rank.
# _F_IN_OFF / _F_OUT_OFF: the tensor's byte offset in its peer-reachable allocation (-1: none),
# so a peer is reached at its own view, whatever offset each rank sliced.
# _F_ARG: the collective's own code that every rank must have alike (LocalCall.agreed).
# _F_IN_BLK / _F_OUT_BLK: which of the group's peer-mapped allocations holds the tensor (the
# executor numbers them in registration order, alike on every rank; -1: none). A rank reaches
# a peer's tensor through its own mapping of that allocation, so the ranks must name the same
# one: where they do not (FSDP's pool handed out blocks in another order on one rank, or a
# user passed tensors from different conccl.empty calls), the call stages through the
# workspace instead, as for tensors no peer can reach.
(_F_SEQ, _F_COLL, _F_DTYPE, _F_IN, _F_OUT, _F_FLAGS, _F_ALGO, _F_IN_OFF, _F_OUT_OFF, _F_ARG, _F_IN_BLK, _F_OUT_BLK,
 _NFIXED) = range(13)
_SYM_IN, _SYM_OUT, _IN_PLACE, _GRAPH = 1, 2, 4, 8  # _GRAPH: the call is being captured into a graph
_ONE_SHOT = 16  # this rank would run the call one-shot: it does where every rank would (an AND)


_MAX_REMEMBERED = 64  # argument sets (and peers' rows per set) a group remembers


@dataclass(eq=False)
class _Local:
    """A call's local step (see :class:`Group`): what its own arguments decide."""

    coll: Collective
    dtype: object
    row: list  # published on the board; the sequence number is written per call
    views: tuple  # the executor's peer_view of (input, output)
    algorithm: Algorithm | None  # as asked for, by the call or the group's default (the row's; None: automatic)
    stream_mode: StreamMode
    call: LocalCall  # what the collective's validation decided
    via_peer: bool = False  # Options.own_chunk_via_peer when it was made (part of its key)
    settled: dict = _field(default_factory=dict)  # rows (sequence numbers zeroed) -> (schedule, views)
    # The rows of its last exchanged calls and how many in a row were alike; once POST_AFTER
    # were, the next calls post their row instead (``posted``: rows, schedule and views).
    last_rows: bytes | None = None
    alike: int = 0
    posted: tuple | None = None


def _plan_own(row, local: "_Local | None" = None) -> bool:
    """Whether no peer's row can change the plan of a call with this rank's ``row`` unless
    they disagree (a mismatch, caught): the flags peers may set differently from call to call
    (a tensor peer-reachable or not, in place or not, one-shot or not) count only where every
    rank sets them (an AND), so with this rank setting none, neither do the peers' offsets
    in their mapped memory. A peer whose tensor moves there may then make the same call.
    A call whose plan reads no tensor kind (``Collective.plan_ignores_tensor_kinds``: an
    all-reduce, an all-gather's staged push) minds the one-shot flag only."""
    ignores = local is not None and local.coll.plan_ignores_tensor_kinds(local.algorithm)
    kinds = 0 if ignores else _SYM_IN | _SYM_OUT | _IN_PLACE
    return not row[_F_FLAGS] & (kinds | _ONE_SHOT)


# Exchanged calls whose rows (but for the sequence number) were alike, in a row, after which a
# local step's calls post their row instead of waiting for the peers' (Options.post_settled).
POST_AFTER = 2


def writes_peers_only_in_workspace(schedule: Schedule) -> bool:
    """Whether every byte ``schedule`` writes on another rank lands in that rank's workspace
    (conccl's own memory), none in a peer's tensors: what a call posted on rows a peer did not
    have may then write only its own output and the workspaces, never a peer's tensors (the
    peers' outputs of that call may be wrong all the same: they read what it staged; the
    mismatch breaks the group). One-shot schedules (one kernel) are left out."""
    if schedule.one_shot:
        return False
    return all(not isinstance(op, Copy) or op.transfer.dst_rank == schedule.rank or op.transfer.dst is Buf.WORKSPACE
               for ops in schedule.slots for op in ops)


def _plain(arg):
    """``arg`` as a key, by value: split sizes only as plain ints (a tensor hashes by identity,
    and its value can change in place), a reduction op as its (name, factor). torch's ReduceOp
    compares PREMUL_SUM(2.0) equal to PREMUL_SUM(3.0), so as a key it would replay the first
    call's factor. Raises TypeError for anything else not remembered."""
    if isinstance(arg, (list, tuple)):
        arg = tuple(arg)
        if not all(type(x) is int for x in arg):
            raise TypeError("split sizes that are not plain ints are not remembered")
        return arg
    if isinstance(arg, (torch.distributed.ReduceOp, torch.distributed.ReduceOp.RedOpType)):
        try:
            return reduce_op(arg, 1)
        except InvalidArgument:  # validation refuses it, in words
            raise TypeError("an unsupported reduction op is not remembered") from None
    return arg


def _check_algorithm(algorithm) -> None:
    if algorithm is not None and not isinstance(algorithm, Algorithm):
        raise InvalidArgument(f"algorithm must be a conccl.Algorithm, got {algorithm!r}")


def _agreed(fixed_row: list) -> tuple:
    """The fields every rank must have alike."""
    return (fixed_row[_F_SEQ], fixed_row[_F_COLL], fixed_row[_F_DTYPE], fixed_row[_F_ALGO], fixed_row[_F_ARG],
            fixed_row[_F_FLAGS] & _GRAPH)


# A call running this long on the GPU gets its peers' liveness checked (cheap: a kill(pid, 0)
# per peer per watchdog round); shorter calls are never judged before their timeout.
_FAST_FAIL_AFTER_S = 0.25


def _code(s: str) -> int:
    return zlib.crc32(s.encode())


@dataclass
class Options:
    """Per-group defaults, chosen from measurements (see README)."""

    # None: push when every rank's output is peer-reachable (the fastest path measured on
    # H200 x4), otherwise pull through the staging workspace.
    algorithm: Algorithm | None = None
    # One stream measured fastest on H200 x4 (benchmarks/): its pulls visit peers in a
    # rotation, so each GPU is read by one peer at a time, and the own shard goes last. Its
    # peer copies as one cudaMemcpyBatchAsync took 13 us less GPU time per call than one
    # cudaMemcpyAsync after another, and as much bandwidth or more at large sizes.
    stream_mode: StreamMode = StreamMode.BATCH
    timeout: timedelta = DEFAULT_TIMEOUT
    # False skips the mismatch checks and the watchdog: for measuring what they cost only, as
    # a dead peer then hangs the GPU stream for good.
    checks: bool = True
    # collective name -> output bytes per rank below which an eager call goes to the group's
    # torch.distributed backend (NCCL) instead of the copy engines: where NCCL alone is faster
    # (conccl.set_eager_path("auto") fills it from a hardware profile). Empty: copy engines
    # always. Every rank must hold the same table (the ranks must route a call alike).
    nccl_below: dict = _field(default_factory=dict)
    # Output bytes per rank below which a call of the public functions runs as one small SM
    # kernel instead of copy engines (conccl.collectives.one_shot): 0 never (the default: copy
    # engines only, no SM). A call runs one-shot only where every rank's would (agreed on the
    # board per call). CONCCL_ONE_SHOT_BELOW sets it for new groups.
    one_shot_below: int = _field(default_factory=lambda: _one_shot_env())
    # A call whose rows were alike on every rank for POST_AFTER calls in a row posts its row on
    # the board and goes on without waiting for the peers' (HostBoard.post); the peers' rows
    # are compared at this rank's next call, and a mismatch then breaks the group (the call ran
    # on rows some rank did not have). Only calls that write nothing of a peer's but its
    # workspace, and grow no workspace. False: every call waits for every peer's row (a
    # mismatch is refused before anything moves, always). CONCCL_POST_SETTLED=0 sets False.
    post_settled: bool = _field(default_factory=lambda: os.environ.get("CONCCL_POST_SETTLED", "1").strip() != "0")
    # True: a push all-gather's own chunk is read back from the first peer's output on a copy
    # engine instead of copied on this GPU, where the copy is an SM kernel and so waits behind
    # a running GEMM (~1 ms beside an 8192^3 bf16 GEMM) (Collective.own_chunk_via_peer). Costs
    # the chunk once more over the link from that peer; each rank's own choice.
    # CONCCL_OWN_CHUNK_VIA_PEER=1 sets it for new groups.
    own_chunk_via_peer: bool = _field(default_factory=lambda: _env_on("CONCCL_OWN_CHUNK_VIA_PEER"))


def _env_on(name: str) -> bool:
    """Whether environment variable ``name`` says on (unset, empty, 0, false, off, no: off)."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "off", "no")


def _one_shot_env() -> int:
    raw = os.environ.get("CONCCL_ONE_SHOT_BELOW", "").strip()
    if raw in ("", "0"):
        return 0
    try:
        return parse_size(raw)
    except (ValueError, TypeError, ArgumentTypeError):
        raise InvalidArgument(f"CONCCL_ONE_SHOT_BELOW must be a size such as 256K or 0, got {raw!r}") from None


def board_row_len(world: int) -> int:
    return _NFIXED + 2 * world


class Group(CollectiveMethods):
    """One process group's conccl state and its collectives over an executor.

    Not thread-safe (like a NCCL communicator). Made by :func:`conccl.get_group` (CUDA) or
    :func:`conccl.testing.reference_group` (CPU); released by :meth:`close`
    (:func:`conccl.destroy` closes every group the API made).
    """

    def __init__(self, executor, board: HostBoard, rank: int, world: int, options: Options | None = None,
                 name: str = "", fallback: tuple | None = None):
        self.executor, self.board, self.rank, self.world, self.name = executor, board, rank, world, name
        board.accept = self._accept_posted  # a posted call's rows that differ may still ask for its plan
        # (library, process group): where calls routed by options.nccl_below go; the library
        # has torch.distributed's functions (torch.distributed itself, on the group's backend).
        self.fallback = fallback
        self.options = options or Options()
        self.seq = 0
        self.persistent_ops = 0  # persistent collectives made on this group (their ids)
        self._ops: weakref.WeakSet = weakref.WeakSet()  # the open ones, closed with the group
        self._resources: dict[str, object] = {}  # what upper layers attached (resource())
        self.graph_slots = 0  # captured calls so far (conccl.schedule.captured): each holds a slot for good
        self._locals: dict[tuple, _Local] = {}  # call key -> its local step
        self._moved: dict[tuple, tuple] = {}  # the parts calls' (agreed schedule, moved schedule)
        self.broken: BaseException | None = None  # the first failure; every later call raises it
        self.closed = False
        self._lock = threading.Lock()  # orders queueing against the watchdog's release
        self.watchdog = None
        if getattr(executor, "tracks_flights", False):
            self.watchdog = Watchdog(self._judge, self.fail, thread_init=executor.bind_thread,
                                     name=f"conccl-watchdog-r{rank}")

    # ------------------------------------------------------------------ collectives
    # A call runs in three steps, and the first and last are remembered, because a loop passes
    # the same tensors call after call (and a call's host time is the cost at small sizes):
    # - local: validate the arguments, look up whether peers can reach them, build the row
    #   this rank publishes. A pure function of the arguments' metadata (``_remembered``).
    # - exchange: publish the row, read every peer's (the agreement); a settled call posts its
    #   row instead and its peers' are compared one call later (_agree, Options.post_settled).
    # - settle: check the rows agree, take every rank's offsets, plan. A pure function of the
    #   local step and the rows, so rows equal to an earlier call's (but for the sequence
    #   number) reuse its checked schedule and views.
    def call(self, coll: Collective, output, input, args: tuple = (), async_op: bool = False, *, algorithm=None,
             stream_mode=None, timeout=None, route: bool = False):
        """Run ``coll`` on (output, input, *args) now; see the API function of ``coll.api_name``.

        ``route``: an eager call below ``options.nccl_below`` runs on the fallback backend.
        Only the public functions route: a call made beside a computation (``conccl.overlap``,
        the FSDP hooks) stays on the copy engines, whose SMs it was planned to spare."""
        if route and self.options.nccl_below and self._routes_to_fallback(coll, output, args, algorithm, stream_mode):
            return self._call_fallback(coll, output, input, args, async_op)
        local = self._local_step(coll, output, input, args, algorithm, stream_mode)
        self._check_usable()
        timeout_s = self._timeout_s(timeout)
        # Only the public functions' calls may run one-shot: a call beside a computation (the
        # same as for NCCL routing above) is planned to spare the SMs.
        one_shot = route and self._wants_one_shot(output, algorithm, stream_mode)
        if self.executor.capturing():
            return self._capture(local, input, output, timeout_s, one_shot)
        schedule, views = self._agree(local, timeout_s, one_shot)
        return self._execute(schedule, input, output, async_op, timeout_s, views)

    def _wants_one_shot(self, output, algorithm, stream_mode) -> bool:
        """Whether this rank would run the call as a one-shot kernel (conccl.collectives.one_shot):
        its output below the group's ``one_shot_below``, no algorithm or stream mode asked for,
        on an executor that has the kernel. The ranks agree on it on the board (``_ONE_SHOT``)."""
        limit = self.options.one_shot_below
        return (limit > 0 and algorithm is None and stream_mode is None and getattr(self.executor, "one_shot", False)
                and 0 < output.numel() * output.element_size() < limit)

    def _routes_to_fallback(self, coll: Collective, output, args, algorithm, stream_mode) -> bool:
        """Whether this call goes to the fallback backend: eager, its output bytes per rank
        below the collective's ``nccl_below``. Never a call with explicit split sizes (they
        differ between ranks, which must route a call alike) or one that asks for a copy-engine
        algorithm or stream mode."""
        limit = self.options.nccl_below.get(coll.name)
        if (not limit or self.fallback is None or algorithm is not None or stream_mode is not None
                or any(isinstance(a, (list, tuple)) for a in args)):
            return False
        try:
            small = output.numel() * output.element_size() < limit
        except AttributeError:  # not a tensor: conccl's validation says so
            return False
        return small and not self.executor.capturing()

    def _call_fallback(self, coll: Collective, output, input, args, async_op: bool) -> Work:
        """Run the call on the fallback backend (torch.distributed's function of the same name)
        at its own cost: no board exchange (its arguments are the backend's to check, as a
        torch.distributed call's are) and no sequence number (no signal is written). The
        executor orders it after the group's previous call and before its next, as its own."""
        self._check_usable()
        lib, pg = self.fallback
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("conccl %s of %d output bytes per rank -> %s (below %d)", coll.name,
                       output.numel() * output.element_size(), getattr(lib, "__name__", lib),
                       self.options.nccl_below[coll.name])
        with self._lock:
            return self.executor.run_fallback(
                lambda: coll.call_with(lib, output, input, tuple(args), group=pg, async_op=async_op),
                async_op, (input, output))

    def set_nccl_below(self, table: dict, timeout=None) -> None:
        """Install ``options.nccl_below``; a collective call: the ranks' tables are compared on
        the board, and differing ones raise InvalidArgument on every rank (a call routed on one
        rank and not on another would wait for the group's timeout)."""
        self.agree(repr(sorted(table.items())), "nccl_below", "conccl.set_eager_path and set_options(nccl_below=) "
                   "must be the same on every rank", timeout)
        self.options.nccl_below = dict(table)

    def agree(self, text: str, what: str, hint: str = "", timeout=None) -> None:
        """A collective call: every rank passes ``text`` (a digest of it crosses the board);
        where any differs, every rank raises InvalidArgument naming the first that does
        (``hint``: what the user must make equal)."""
        digest = zlib.crc32(text.encode())
        try:
            rows = self.board.exchange([digest], f"conccl {what}", self._timeout_s(timeout))
        except PostedMismatch as e:
            self._posted_mismatch(e)
        differ = [p for p in range(self.world) if rows[p, 0] != digest]
        if differ:
            raise InvalidArgument(f"conccl {what}: rank {differ[0]} has another {what} than rank {self.rank} ({text[:200]})"
                                  + (f"; {hint}" if hint else ""))

    def exchange_values(self, values, what: str, timeout=None) -> list[list[int]]:
        """A collective call on the host board alone, no GPU work: every rank passes ``values``
        (whole numbers, as many on every rank) and gets every rank's, in rank order. For small
        tables the host needs anyway (conccl.ep's sizes): no device collective, no stream. In
        pieces of the board's row length, one host rendezvous each. A peer that never comes
        raises CollectiveTimeout (and breaks the group) as a collective's does."""
        self._check_usable()
        values = [int(v) for v in values]
        timeout_s = self._timeout_s(timeout)
        out: list[list[int]] = [[] for _ in range(self.world)]
        step = self.board.row_len
        for i in range(0, len(values), step):
            part = values[i:i + step]
            rows = self._board_exchange(part, f"conccl {what}", timeout_s)
            for r in range(self.world):
                out[r].extend(rows[r, :len(part)].tolist())
        return out

    def all_gather_into_parts(self, output, input, parts, timeout=None, fixed_input: bool = False) -> Work:
        """An all-gather of ``input`` (each rank's chunk of ``output``, in place) whose bytes land
        in ``parts`` instead of ``output``: ``parts[i]`` is a tensor of ``world * n_i`` bytes'
        worth that takes the i-th ``n_i`` bytes of every rank's chunk, rank r's at row r.
        ``output`` is only read by the peers (it should be peer-reachable: a pool block); the
        parts are this rank's alone. ``output`` None: no flat output at all, the peers read
        ``input`` itself (it should be peer-reachable: FSDP's sharded parameters moved into a
        pool block, ``conccl.fsdp.copy_free``). Blocking, on the caller's stream, never captured. For FSDP
        (``conccl.fsdp``, ``direct=True``): each parameter's unsharded tensor filled straight from
        the peers, with no copy-out (:mod:`conccl.group.parts`). ``fixed_input`` (with ``output``
        None): every rank passes the same peer-reachable input at every call (FSDP's homes), so
        a settled call may post its row without waiting for the peers' (Options.post_settled)."""
        return parts_mod.all_gather_into_parts(self, output, input, parts, timeout, fixed_input)

    def reduce_scatter_from_parts(self, output, parts, rows, op=None, timeout=None) -> Work:
        """A reduce-scatter into ``output`` whose input is ``parts`` instead of one flat tensor:
        ``parts[i]`` (contiguous, one dtype: the output's, or bf16/fp16 summed into an fp32
        output, each widened exactly; on the output's device) is ``world`` rows of ``rows[i]``
        elements, of which only its first ``parts[i].numel()`` exist (the rest is padding: what
        it reduces to in ``output`` is unspecified); the flat input it stands for is row ``d``
        of every part, in order, for rank ``d`` (FSDP's ``chunk_cat``), so ``sum(rows)`` is the
        output's size. ``op``: as :func:`conccl.reduce_scatter_tensor` (None: SUM). The peers
        see a flat reduce-scatter and may make one (not where this call widens: its chunks move
        in 16 bits, so every rank's call must widen alike). The same bits as the flat call (of
        the parts cast to fp32, where it widens). Blocking,
        on the caller's stream, never captured; the parts are read by this rank's copy engines
        until the caller's stream passes the call. For FSDP (``direct=True``): the gradients
        reduced where autograd left them, with no copy-in (:mod:`conccl.group.parts`)."""
        return parts_mod.reduce_scatter_from_parts(self, output, parts, rows, op, timeout)

    def persistent(self, coll: Collective, output, input, args: tuple = (), *, algorithm=None, stream_mode=None,
                   timeout=None) -> PersistentCollective:
        """Agree ``coll`` on these buffers once (validate, exchange, settle, as a call does);
        the returned op starts it with only the execute step (see :mod:`conccl.group.persistent`)."""
        local = self._local_step(coll, output, input, args, algorithm, stream_mode)
        self._check_usable()
        timeout_s = self._timeout_s(timeout)
        schedule, views = self._agree(local, timeout_s, may_post=False)  # its starts skip the board
        self.persistent_ops += 1
        op = PersistentCollective(self, self.persistent_ops, coll, schedule, views, input, output, timeout_s,
                                  tuple(args))
        self._ops.add(op)
        return op

    # ------------------------------------------------------------------ steps
    def _local_step(self, coll: Collective, output, input, args, algorithm, stream_mode) -> "_Local":
        """The call's local step, remembered or made now."""
        key, local = self._remembered(coll.name, output, input, algorithm, stream_mode, *args)
        return local if local is not None else self._local(coll, output, input, args, algorithm, stream_mode, key)

    def _remembered(self, coll, output, input, *args):
        """(key, remembered local step or None); the key is None when it cannot be had.

        The key is everything the local step reads. Validation depends on the tensors' address,
        shape, strides, dtype and device; the peer-reachable views on the address and the
        executor's allocations (its generation grows with every symmetric allocation); the row
        on the options too."""
        try:
            if not (output.numel() and input.numel()):
                # an empty tensor's address names no storage (a slice's end is another block's
                # start): what validation reads from it differs at the same address
                return None, None
            key = (coll, output.data_ptr(), input.data_ptr(), output.shape, input.shape, output.stride(),
                   input.stride(), output.dtype, input.dtype, output.device, input.device,
                   self.executor.views_generation, self.options.algorithm, self.options.stream_mode,
                   self.options.checks, self.options.one_shot_below, self.options.own_chunk_via_peer,
                   *map(_plain, args))
            return key, self._locals.get(key)  # hashes the key once; raises if it cannot
        except (AttributeError, TypeError, RuntimeError):  # not tensors, odd splits: not remembered
            return None, None

    def _local(self, coll: Collective, output, input, args, algorithm, stream_mode, key) -> "_Local":
        ex = self.executor
        call = coll.local(output, input, tuple(args), self.world, self.rank, ex.device_type)
        local = self._local_row(coll, call, input.dtype, input.numel() * input.element_size(),
                                output.numel() * output.element_size(), (ex.peer_view(input), ex.peer_view(output)),
                                algorithm, stream_mode)
        return local if key is None else self._remember(key, local)

    def _remember(self, key, local: "_Local") -> "_Local":
        if len(self._locals) >= _MAX_REMEMBERED:
            self._locals.clear()
        self._locals[key] = local
        return local

    def _local_row(self, coll: Collective, call: LocalCall, dtype, in_bytes: int, out_bytes: int, views, algorithm,
                   stream_mode) -> "_Local":
        """The local step of a validated ``call``: its board row. The row names the algorithm the
        call asks for, its own or else the group's default: the default is each rank's own
        (``set_options``), and ranks that asked for different ones must be refused alike (a
        push on one rank and a pull on the other each wait for signals that say nothing of
        the other's copies: a silently wrong output)."""
        _check_algorithm(algorithm)
        asked = algorithm or self.options.algorithm
        if algorithm is None and (not coll.follows_group_default
                                  or (asked is Algorithm.STAGED_PUSH and not coll.staged_push)):
            asked = None  # a default for the collectives that take it (the gathers), not a request
        # An in-place input is reached through the output, at another offset on every rank.
        flags = (_SYM_IN * (views[0] is not None and not call.in_place) | _SYM_OUT * (views[1] is not None)
                 | _IN_PLACE * call.in_place)
        row = [0, _code(coll.name), _code(str(dtype)), in_bytes, out_bytes, flags,
               -1 if asked is None else _code(asked.value),
               -1 if views[0] is None else views[0][1], -1 if views[1] is None else views[1][1],
               call.agreed, -1 if views[0] is None else views[0][2], -1 if views[1] is None else views[1][2],
               *call.send, *call.recv]
        return _Local(coll, dtype, row, views, asked, stream_mode or self.options.stream_mode, call,
                      self.options.own_chunk_via_peer)

    def _agree(self, local: "_Local", timeout_s: float, one_shot: bool = False, may_post: bool = True,
               peers_fixed: bool = False) -> tuple:
        """(schedule, views) every rank derives from every rank's row for the next call;
        ``one_shot``: this rank would run it one-shot (it does where every rank would). A call
        alike on every rank for the last POST_AFTER calls posts its row and takes the last
        rows' plan without waiting (``Options.post_settled``), unless ``may_post`` is False
        (an agreement that outlives the call: a persistent op's), and only where no peer's
        row can change the plan without this rank's changing too (:func:`_plan_own`), or
        ``peers_fixed``: the caller knows every rank passes the same peer-reachable tensors
        at every call (FSDP's homes, made alike on every rank once)."""
        seq = self.seq + 1
        local.row[_F_FLAGS] = (local.row[_F_FLAGS] & ~_ONE_SHOT) | (_ONE_SHOT * one_shot)
        posted = local.posted  # once: the watchdog's thread may drop it (_accept_posted)
        if may_post and posted is not None and self._post(local, posted, seq, timeout_s):
            return posted[1]
        rows = self._exchange(local, seq, timeout_s)
        rows[:, _F_SEQ] -= seq  # the rows as an earlier call with the same peers' arguments saw them
        key = rows.tobytes()
        settled = local.settled.get(key)
        if settled is None:
            rows[:, _F_SEQ] += seq
            settled = self._settle(local, rows, seq)
            rows[:, _F_SEQ] -= seq
            if len(local.settled) >= _MAX_REMEMBERED:
                local.settled.clear()
            local.settled[key] = settled
        local.alike = local.alike + 1 if key == local.last_rows else 1
        local.last_rows = key
        local.posted = None
        if (local.alike >= POST_AFTER and self.options.post_settled and (peers_fixed or _plan_own(local.row, local))
                and local.coll.plan_fixed_by_own_row(self.world) and writes_peers_only_in_workspace(settled[0])):
            local.posted = (rows, settled)
        return settled

    def _post(self, local: "_Local", posted: tuple, seq: int, timeout_s: float) -> bool:
        """Post this call's row (``posted``: the rows and plan it assumes); False where it cannot
        be (its own row is not the one agreed, or it would grow the workspace, a collective
        allocation): it then exchanges as any call. A mismatch of an earlier post found
        meanwhile breaks the group."""
        rows, (schedule, _) = posted
        # The own row is the local step's but for the sequence number and the one-shot flag.
        if (not self.options.post_settled or schedule.workspace_need > self.executor.workspace_bytes
                or local.row[_F_FLAGS] != rows[self.rank, _F_FLAGS] or self.executor.capturing()):
            return False
        expected = rows.copy()
        expected[:, _F_SEQ] += seq
        local.row[_F_SEQ] = seq
        try:
            self.board.post(local.row, expected, f"conccl {local.coll.name}", seq, timeout_s, (local, posted[1], seq))
        except PostedMismatch as e:
            self._posted_mismatch(e)
        except (CollectiveTimeout, GroupBroken) as e:
            self.fail(e)
            raise
        return True

    def _accept_posted(self, token, rows) -> bool:
        """Whether a posted call (``token``: its local step, the plan it ran, its sequence
        number) ran what every rank's published ``rows`` ask for, though they are not the rows
        it assumed (a peer's tensor moved within its mapped memory, say): the plan from them is
        the same. The local step exchanges again from its next call. Pure but for that; the
        watchdog's thread may call it."""
        local, ran, seq = token
        local.posted, local.alike = None, 0
        try:
            settled = self._settle(local, rows, seq, breaks=False)
            if local.coll.plan_ignores_tensor_kinds(local.algorithm):  # peers' views unread: the schedule decides
                return settled[0] == ran[0]
            return settled == ran
        except Exception:  # noqa: BLE001 - rows no plan comes from: a mismatch, which breaks the group
            return False

    def _posted_mismatch(self, e: PostedMismatch):
        """An earlier call posted on rows some rank did not have: it may have moved bytes by
        the wrong plan (into this rank's output and the peers' workspaces only), so the group
        breaks, on every rank (the abort word), and this raises."""
        ranks = ", ".join(map(str, e.ranks))
        error = CollectiveError(
            f"{e.what} (sequence number {e.seq}) on rank {self.rank}: rank(s) {ranks} made another call than this "
            "rank, which repeated its earlier call without waiting for the peers (Options.post_settled); its output "
            "is not to be used, and the group is broken. Every rank must make the same calls in the same order.")
        error.seq = e.seq  # the abort names that call: its handles, and later ones, fail
        self.fail(error)
        raise error from e

    def _capture(self, local: "_Local", input, output, timeout_s: float, one_shot: bool = False) -> Work:
        """A call made while the caller's stream is being captured into a graph: agreed with the
        peers now (they must be capturing the same call), run at every replay on a graph slot
        of its own (:mod:`conccl.schedule.captured`). Takes no sequence number: eager calls go on as if
        it were not there. Returns a completed Work: the call is ordered on the stream."""
        schedule, views = self._agree_captured(local, timeout_s, one_shot)
        return self.capture_schedule(schedule, input, output, views, timeout_s)

    def _agree_captured(self, local: "_Local", timeout_s: float, one_shot: bool = False):
        """:meth:`_agree` for a call being captured (flagged so: a peer capturing another call,
        or running one eagerly, is a mismatch)."""
        self._check_graph_slot()
        row = list(local.row)
        row[_F_FLAGS] |= _GRAPH
        captured = _Local(local.coll, local.dtype, row, local.views, local.algorithm, local.stream_mode, local.call,
                          local.via_peer)
        return self._agree(captured, timeout_s, one_shot)

    def _check_graph_slot(self) -> None:
        if self.graph_slots >= GRAPH_SLOTS:
            raise InvalidArgument(f"this conccl group has captured {GRAPH_SLOTS} calls, all it can hold; destroy the "
                                  "group (conccl.destroy) to capture more")

    def capture_schedule(self, schedule, input, output, views, timeout_s: float, compute=None) -> Work:
        """Capture an agreed ``schedule`` (a call's, a persistent op's start, or a pipeline with
        its ``compute``) on the next graph slot. Every rank must capture the same calls in the
        same order."""
        self._check_graph_slot()
        slot = self.graph_slots
        try:
            self.executor.capture_call(graph_schedule(schedule), input, output, views, slot, timeout_s,
                                       compute=compute)
        except Exception as e:
            # The peers captured this call (it was agreed): a rank that did not would replay out
            # of step with them, on other slots, where no watchdog looks. Break the group.
            error = CollectiveError(f"capturing a conccl {schedule.collective} failed on this rank after the peers "
                                    f"agreed it: {type(e).__name__}: {e}")
            self.fail(error)
            raise error from e
        finally:
            self.graph_slots += 1
        return Work(path=ONE_SHOT if schedule.one_shot else None)

    def _exchange(self, local: "_Local", seq: int, timeout_s: float):
        """Publish this call on the board and read every rank's row.

        The call takes its sequence number only when it is queued (``_execute``): a mismatch
        raises on every rank alike before that, so the ranks stay in step and the group usable
        (unless a peer posted this call: ``_settle``).
        """
        local.row[_F_SEQ] = seq
        return self._board_exchange(local.row, f"conccl {local.coll.name}", timeout_s, seq)

    def _board_exchange(self, row, what: str, timeout_s: float, seq: int | None = None):
        """The board's exchange of ``row``; a peer that never comes, or an earlier posted call
        found to have differed, breaks the group."""
        try:
            return self.board.exchange(row, what, timeout_s, seq)
        except PostedMismatch as e:
            self._posted_mismatch(e)
        except (CollectiveTimeout, GroupBroken) as e:
            self.fail(e)
            raise

    def _settle(self, local: "_Local", rows, seq: int, breaks: bool = True) -> tuple:
        """Check that every rank made the same call (raising alike on every rank), then plan.
        ``breaks``: a disagreement with a peer that posted its row breaks the group."""
        w = self.world
        peers = _peer_calls(rows, w)
        try:
            if self.options.checks:
                fixed = rows[:, :_NFIXED].tolist()
                mine = _agreed(fixed[self.rank])
                if any(_agreed(x) != mine for x in fixed):
                    self._disagreement(local.coll.name, local.dtype, seq, rows)
            # Even unchecked: a plan from byte counts the peers disagree on would copy out of bounds.
            local.coll.check(peers, self.rank, seq)
        except (CollectiveError, InvalidArgument) as e:
            posted = [p for p in range(w) if self.board.last_posted[p]]
            if not (breaks and posted):
                raise
            # A peer posted its row and went on (Options.post_settled): its call is under way
            # on rows this rank did not have. Break the group, so that it learns at once.
            error = CollectiveError(
                str(e).replace("; nothing was moved", "") + f"; rank(s) {', '.join(map(str, posted))} had posted "
                "this call without waiting for the peers (Options.post_settled) and ran it: the group is broken")
            error.seq = seq
            self.fail(error)
            raise error from e
        all_flags = _all_flags(rows)
        schedule = local.coll.plan(
            w, self.rank, local.call, peers,
            algorithm=local.coll.algorithm(local.algorithm, bool(all_flags & _SYM_OUT), local.call, w),
            stream_mode=local.stream_mode, input_symmetric=bool(all_flags & _SYM_IN),
            output_symmetric=bool(all_flags & _SYM_OUT), peers_in_place=bool(all_flags & _IN_PLACE))
        if local.via_peer:  # this rank's own choice (Options): no peer's plan changes
            schedule = local.coll.own_chunk_via_peer(schedule)
        if all_flags & _ONE_SHOT:  # every rank would: a pure function of the rows, alike everywhere
            shot = one_shot_plan(local.coll.name, w, self.rank, local.call, peers)
            if shot is not None and shot.workspace_need <= DOUBLE_BUFFER_MAX_BYTES:
                schedule = shot
        return schedule, _peer_views(local.views, rows, all_flags)

    def _disagreement(self, coll, dtype, seq, rows):
        graph = rows[:, _F_FLAGS] & _GRAPH
        if (graph != graph[self.rank]).any():
            bad = [p for p in range(self.world) if graph[p] != graph[self.rank]]
            raise CollectiveError(
                f"conccl {coll} (sequence number {seq}) on rank {self.rank}: rank {bad[0]} "
                f"{'made it eagerly' if graph[self.rank] else 'captured it into a CUDA graph'} while this rank "
                f"{'captured it into a CUDA graph' if graph[self.rank] else 'made it eagerly'}; every rank must "
                "capture the same calls; nothing was moved")
        for field, what in ((_F_SEQ, "sequence number"), (_F_COLL, "collective"), (_F_DTYPE, "dtype"),
                            (_F_ALGO, "algorithm"), (_F_ARG, "reduction op")):
            bad = [p for p in range(self.world) if rows[p, field] != rows[self.rank, field]]
            if bad:
                raise CollectiveError(
                    f"conccl {coll} (sequence number {seq}) on rank {self.rank}: rank {bad[0]} called with a different "
                    f"{what} ({_describe(field, rows[bad[0], field], dtype)} vs {_describe(field, rows[self.rank, field], dtype)} here"
                    f"{'; asked per call or by set_options' if field == _F_ALGO else ''}); nothing was moved")

    def _timeout_s(self, timeout) -> float:
        t = timeout if timeout is not None else self.options.timeout
        seconds = t.total_seconds() if isinstance(t, timedelta) else float(t)
        if not seconds > 0:
            raise InvalidArgument(f"timeout must be positive, got {t!r}")
        return seconds

    def _execute(self, schedule, input, output, async_op, timeout_s: float, views, compute=None):
        seq = self.seq + 1
        flight = None
        if self.watchdog is not None and self.options.checks:
            flight = Flight(seq, f"conccl {schedule.collective}", timeout_s, None, None, schedule, self._late_verdict)
        try:
            with self._lock:  # the watchdog releases under this lock: no call slips in between
                self._check_usable()
                self.executor.ensure_workspace(schedule.workspace_need)
                self.seq = seq
                if compute is None:
                    work = self.executor.run(schedule, input, output, seq, async_op, timeout_s, flight, views)
                else:  # a pipeline (conccl.schedule.pipeline): the caller's GEMM steps run inside it
                    work = self.executor.run(schedule, input, output, seq, async_op, timeout_s, flight, views,
                                             compute=compute)
        except PostedMismatch as e:  # the reference executor compares posted rows while it waits
            self._posted_mismatch(e)
        except (CollectiveTimeout, GroupBroken) as e:  # the reference executor waits on the host
            self.fail(e)
            raise
        except Exception as e:
            # The call took its sequence number but may have signalled nothing (a driver or
            # compile error): its peers would wait for good and the next call for words that
            # never come. Break the group instead, so every rank gets an error.
            if self.seq == seq:
                self.fail(e)
            raise
        if flight is not None and flight.end is not None:
            self.watchdog.track(flight)
        if schedule.one_shot:  # an SM kernel ran it, not the copy engines: say so
            work.path = ONE_SHOT
        return work

    # ------------------------------------------------------------------ failures
    def _check_usable(self) -> None:
        if self.broken is not None:
            raise GroupBroken(
                f"this conccl group is broken since an earlier collective failed ({self.broken}); nothing was moved. "
                "Destroy the group (conccl.destroy) and create a new one.", self.broken) from self.broken

    def fail(self, error: BaseException) -> None:
        """Break the group with ``error``: tell the peers, fail and release every call in flight."""
        with self._lock:
            if self.broken is None:
                self.broken = error
                if not isinstance(error, GroupBroken):  # a peer's abort is on the board already
                    missing = list(getattr(error, "missing", []))
                    kind = (ABORT_EXITED if getattr(error, "exited", None) else ABORT_TIMEOUT
                            if isinstance(error, CollectiveTimeout) else ABORT_OTHER)
                    self.board.abort(getattr(error, "seq", self.seq), kind, missing)
            flights = self.watchdog.drain(error) if self.watchdog is not None else []
            if flights:
                # Every wait queued so far waits for a value <= self.seq: writing it into the
                # own pad lets the streams drain (the outputs are garbage, and flagged so).
                self.executor.release(self.seq)

    def _judge(self, flight: Flight, running_s: float):
        """The watchdog's verdict on the oldest unfinished call (None: keep waiting)."""
        if running_s > flight.timeout_s:
            missing = self.executor.missing_peers(flight.schedule, flight.seq)
            return CollectiveTimeout(flight.what, flight.seq, missing, running_s, self.board.exited_peers(missing))
        if running_s < _FAST_FAIL_AFTER_S:
            return None
        posted = self.board.posted_mismatch()
        if posted is not None:  # a call posted on rows a peer did not have may wait for good
            error = CollectiveError(f"{posted}; the group is broken (Options.post_settled)")
            error.seq = posted.seq
            return error
        broken = self.board.aborted()
        exited = self.board.exited_peers()
        if broken is None and not exited:
            return None
        missing = self.executor.missing_peers(flight.schedule, flight.seq)
        if broken is not None and missing:  # a peer gave up on the group: these never come
            return CollectiveTimeout(flight.what, flight.seq, missing, running_s, [p for p in missing if p in exited],
                                     note=str(broken))
        gone = [p for p in missing if p in exited]
        if gone:  # a dead process never writes its signal: no need to wait for the timeout
            return CollectiveTimeout(flight.what, flight.seq, missing, running_s, gone)
        return None

    def _late_verdict(self, seq: int):
        broken = None if self.board.closed else self.board.aborted()
        return broken if broken is not None and broken.seq <= seq else None

    def resource(self, key: str, make):
        """The object an upper layer keeps for this group under ``key``, made by ``make()`` on
        first use; closed (its ``close()``, if any) when the group closes."""
        if self.closed:
            raise InvalidArgument(f"conccl group {self.name!r} is closed")
        obj = self._resources.get(key)
        if obj is None:
            obj = self._resources[key] = make()
        return obj

    def close(self) -> None:
        """Release everything the group holds: persistent ops, attached resources, the
        watchdog's thread, the executor's memory and the board. Local and idempotent; every
        rank closes its own (a peer still calling then times out, as with any absent peer)."""
        if self.closed:
            return
        self.closed = True
        for op in list(self._ops):
            op.close()
        for obj in reversed(list(self._resources.values())):
            close = getattr(obj, "close", None)
            if close is not None:
                close()
        self._resources.clear()
        self._locals.clear()
        try:  # the last posted calls: compared where the peers' rows are there (never waits)
            if not self.board.closed:
                self.board.check_posted()
        except PostedMismatch as e:
            _log.warning("conccl: %s (found as the group closed; those calls' outputs are not to be used)", e)
        if self.watchdog is not None:
            self.watchdog.close()
        self.executor.close()
        self.board.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"seq {self.seq}"
        return f"Group({self.name!r}, rank {self.rank}/{self.world}, {state})"


def _peer_views(views, rows, all_flags: int) -> tuple:
    """The executor's (peer bases, own offset) views with every rank's offset instead of the own:
    ((bases, (offset of rank 0, ...)), ...), None where some rank's tensor is not peer-reachable."""
    out = []
    for view, flag, field in ((views[0], _SYM_IN, _F_IN_OFF), (views[1], _SYM_OUT, _F_OUT_OFF)):
        out.append((view[0], tuple(rows[:, field].tolist())) if view is not None and all_flags & flag else None)
    return tuple(out)


def _peer_calls(rows, world: int) -> PeerCalls:
    """What every rank's row says it sends and receives."""
    splits = rows[:, _NFIXED:_NFIXED + 2 * world].tolist()  # plain ints: cheaper than numpy scalars
    return PeerCalls(send=tuple(tuple(r[:world]) for r in splits), recv=tuple(tuple(r[world:]) for r in splits),
                     input_bytes=tuple(rows[:, _F_IN].tolist()), output_bytes=tuple(rows[:, _F_OUT].tolist()))


def _all_flags(rows) -> int:
    """Flags set on every rank (an AND over ranks); a tensor is peer-reachable only where every
    rank names the same mapped allocation for it."""
    flags = int(np.bitwise_and.reduce(rows[:, _F_FLAGS]))
    for flag, field in ((_SYM_IN, _F_IN_BLK), (_SYM_OUT, _F_OUT_BLK)):
        if (rows[:, field] != rows[0, field]).any():
            flags &= ~flag
    return flags


def _describe(field: int, value, dtype) -> str:
    if field == _F_DTYPE:
        names = {_code(str(d)): str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
        return names.get(int(value), f"dtype#{int(value)}")
    if field == _F_COLL:
        return {_code(n): n for n in REGISTRY}.get(int(value), f"collective#{int(value)}")
    if field == _F_ALGO:
        return {_code(a.value): a.value for a in Algorithm}.get(int(value), "automatic")
    return str(int(value))

