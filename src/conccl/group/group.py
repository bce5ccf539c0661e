"""A Group: one process group's conccl state, and the front end every executor shares.

A :class:`Group` owns everything conccl keeps for one process group (its host board, its
executor with the signal pads, workspace and peer-reachable allocations, its watchdog, its
persistent ops and whatever an upper layer attaches with :meth:`Group.resource`) and
releases all of it in :meth:`Group.close`. Its calls are generic over
:class:`~conccl.collectives.base.Collective`: a collective says how to validate, check and
plan; the group does the rest, the same for every collective.

A call goes through four steps, the first three on the host and before anything is queued:

1. the local step (:mod:`conccl.group.local`): validate the local arguments (a bad call raises
   and leaves the output untouched), build the row this rank publishes (:mod:`conccl.group.row`);
2. the agreement (:mod:`conccl.group.agreement`): publish the row on the group's host board and
   read every peer's; a peer that disagrees is named in the error instead of bytes being moved,
   and every rank derives the same decisions from the same rows. A call that repeats a settled
   one only *posts* its row; the peers' rows are compared at its next call;
3. plan: a pure, cached function of sizes and options gives the rank's :class:`Schedule`;
4. execute it on the executor (copy engines on CUDA, shared memory in the CPU reference).

Failure handling (a dead, late or mismatched peer): step 2 is bounded by the call's timeout
and notices a peer whose process exited; a mismatch raises on every rank before anything
moves and leaves the group usable, but where a rank had posted the call (it ran on rows some
rank did not have): that breaks the group, found at the next call. Once queued, a CUDA call
is watched by the group's :class:`~conccl.group.watchdog.Watchdog`. A timeout, on the host or
the GPU, *breaks* the group: the cause is posted on the board for the peers, the GPU's stream
waits are released, and every later call raises :class:`~conccl.errors.GroupBroken` at once
with the original cause.
"""
from __future__ import annotations

import logging
import threading
import weakref
from datetime import timedelta

from .board import ABORT_EXITED, ABORT_OTHER, ABORT_TIMEOUT, HostBoard, PostedMismatch
from ..collectives import Collective
from ..errors import CollectiveError, CollectiveTimeout, GroupBroken, InvalidArgument
from ..schedule.captured import GRAPH_SLOTS, graph_schedule
from .agreement import Agreement
from .local import LocalStep, LocalSteps
from .options import DEFAULT_TIMEOUT, Options
from .persistent import PersistentCollective
from .row import board_row_len, code
from .watchdog import Flight, Watchdog
from . import parts as parts_mod
from .methods import CollectiveMethods
from .work import ONE_SHOT, Work

__all__ = ["DEFAULT_TIMEOUT", "Group", "Options", "board_row_len"]

_log = logging.getLogger("conccl")

# A call running this long on the GPU gets its peers' liveness checked (cheap: a kill(pid, 0)
# per peer per watchdog round); shorter calls are never judged before their timeout.
_FAST_FAIL_AFTER_S = 0.25


class Group(CollectiveMethods):
    """One process group's conccl state and its collectives over an executor.

    Not thread-safe (like a NCCL communicator). Made by :func:`conccl.get_group` (CUDA) or
    :func:`conccl.testing.reference_group` (CPU); released by :meth:`close`
    (:func:`conccl.destroy` closes every group the API made). Offers what
    :class:`~conccl.group.protocol.CollectiveGroup` names, and the parts of the call protocol
    the group's own modules build on (:attr:`local_steps`, :attr:`agreement`,
    :meth:`agree_call`, :meth:`execute`).
    """

    def __init__(self, executor, board: HostBoard, rank: int, world: int, options: Options | None = None,
                 name: str = "", fallback: tuple | None = None):
        self.executor, self.board, self.rank, self.world, self.name = executor, board, rank, world, name
        # (library, process group): where calls routed by options.nccl_below go; the library
        # has torch.distributed's functions (torch.distributed itself, on the group's backend).
        self.fallback = fallback
        self.options = options or Options()
        self.seq = 0
        self.persistent_ops = 0  # persistent collectives made on this group (their ids)
        self._ops: weakref.WeakSet = weakref.WeakSet()  # the open ones, closed with the group
        self._resources: dict[str, object] = {}  # what upper layers attached (resource())
        self.graph_slots = 0  # captured calls so far (conccl.schedule.captured): each holds a slot for good
        self.local_steps = LocalSteps(executor, rank, world, self.options)  # call key -> its local step
        self.agreement = Agreement(board, executor, rank, world, self.options, self.fail)
        # the parts and pipeline calls' (agreed schedule, moved schedule): conccl.group.parts.moved_schedule
        self.moved_schedules: dict[tuple, tuple] = {}
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
    # the local step (LocalSteps), the exchange or post of its row, and the settled step
    # (Agreement.settle), remembered by the peers' rows (docs/design.md, "The call protocol's words").
    def call(self, coll: Collective, output, input, args: tuple = (), async_op: bool = False, *, algorithm=None,
             stream_mode=None, timeout=None, route: bool = False):
        """Run ``coll`` on (output, input, *args) now; see the API function of ``coll.api_name``.

        ``route``: an eager call below ``options.nccl_below`` runs on the fallback backend.
        Only the public functions route: a call made beside a computation (``conccl.overlap``,
        the FSDP hooks) stays on the copy engines, whose SMs it was planned to spare."""
        if route and self.options.nccl_below and self._routes_to_fallback(coll, output, args, algorithm, stream_mode):
            return self._call_fallback(coll, output, input, args, async_op)
        local = self.local_steps.step(coll, output, input, args, algorithm, stream_mode)
        self.check_usable()
        timeout_s = self.timeout_s(timeout)
        # Only the public functions' calls may run one-shot: a call beside a computation (the
        # same as for NCCL routing above) is planned to spare the SMs.
        one_shot = route and self._wants_one_shot(output, algorithm, stream_mode)
        if self.executor.capturing():
            schedule, views = self.agree_captured(local, timeout_s, one_shot)
            return self.capture_schedule(schedule, input, output, views, timeout_s)
        schedule, views = self.agreement.agree(local, self.seq + 1, timeout_s, one_shot)
        return self.execute(schedule, input, output, async_op, timeout_s, views)

    def _wants_one_shot(self, output, algorithm, stream_mode) -> bool:
        """Whether this rank would run the call as a one-shot kernel (conccl.collectives.one_shot):
        its output below the group's ``one_shot_below``, no algorithm or stream mode asked for,
        on an executor that has the kernel. The ranks agree on it on the board (``row.FLAG_ONE_SHOT``)."""
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
        self.check_usable()
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
        digest = code(text)
        try:
            rows = self.board.exchange([digest], f"conccl {what}", self.timeout_s(timeout))
        except PostedMismatch as e:
            self.agreement.posted_mismatch(e)
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
        self.check_usable()
        values = [int(v) for v in values]
        timeout_s = self.timeout_s(timeout)
        out: list[list[int]] = [[] for _ in range(self.world)]
        step = self.board.row_len
        for i in range(0, len(values), step):
            part = values[i:i + step]
            rows = self.agreement.exchange(part, f"conccl {what}", timeout_s)
            for r in range(self.world):
                out[r].extend(rows[r, :len(part)].tolist())
        return out

    def all_gather_into_parts(self, output, input, parts, timeout=None, fixed_input: bool = False) -> Work:
        """See :func:`conccl.group.parts.all_gather_into_parts` (FSDP's parameters gathered with no
        copy-out)."""
        return parts_mod.all_gather_into_parts(self, output, input, parts, timeout, fixed_input)

    def reduce_scatter_from_parts(self, output, parts, rows, op=None, timeout=None) -> Work:
        """See :func:`conccl.group.parts.reduce_scatter_from_parts` (FSDP's gradients reduced with no
        copy-in)."""
        return parts_mod.reduce_scatter_from_parts(self, output, parts, rows, op, timeout)

    def persistent(self, coll: Collective, output, input, args: tuple = (), *, algorithm=None, stream_mode=None,
                   timeout=None) -> PersistentCollective:
        """Agree ``coll`` on these buffers once (validate, exchange, settle, as a call does);
        the returned op starts it with only the execute step (see :mod:`conccl.group.persistent`)."""
        local = self.local_steps.step(coll, output, input, args, algorithm, stream_mode)
        self.check_usable()
        timeout_s = self.timeout_s(timeout)
        schedule, views = self.agree_call(local, timeout_s, may_post=False)  # its starts skip the board
        self.persistent_ops += 1
        op = PersistentCollective(self, self.persistent_ops, coll, schedule, views, input, output, timeout_s,
                                  tuple(args))
        self._ops.add(op)
        return op

    # ------------------------------------------------------------------ agreement and execution
    def agree_call(self, local: LocalStep, timeout_s: float, one_shot: bool = False, may_post: bool = True,
                   peers_fixed: bool = False) -> tuple:
        """(schedule, views) of the next call of ``local`` (:meth:`Agreement.agree
        <conccl.group.agreement.Agreement.agree>` with the group's next sequence number)."""
        return self.agreement.agree(local, self.seq + 1, timeout_s, one_shot, may_post, peers_fixed)

    def agree_captured(self, local: LocalStep, timeout_s: float, one_shot: bool = False) -> tuple:
        """:meth:`agree_call` for a call being captured into a graph (flagged so: a peer
        capturing another call, or running one eagerly, is a mismatch). Captured at every
        replay on a graph slot of its own (:meth:`capture_schedule`), it takes no sequence
        number: eager calls go on as if it were not there."""
        self._check_graph_slot()
        return self.agreement.agree(local.captured(), self.seq + 1, timeout_s, one_shot)

    def _check_graph_slot(self) -> None:
        if self.graph_slots >= GRAPH_SLOTS:
            raise InvalidArgument(f"this conccl group has captured {GRAPH_SLOTS} calls, all it can hold; destroy the "
                                  "group (conccl.destroy) to capture more")

    def capture_schedule(self, schedule, input, output, views, timeout_s: float, compute=None) -> Work:
        """Capture an agreed ``schedule`` (a call's, a persistent op's start, or a pipeline with
        its ``compute``) on the next graph slot. Every rank must capture the same calls in the
        same order. Returns a completed Work: the call is ordered on the stream."""
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

    def timeout_s(self, timeout) -> float:
        """``timeout`` (seconds, a timedelta, or None: the group's) in seconds; InvalidArgument
        unless positive."""
        t = timeout if timeout is not None else self.options.timeout
        seconds = t.total_seconds() if isinstance(t, timedelta) else float(t)
        if not seconds > 0:
            raise InvalidArgument(f"timeout must be positive, got {t!r}")
        return seconds

    def execute(self, schedule, input, output, async_op, timeout_s: float, views, compute=None) -> Work:
        """Queue (CUDA) or run (reference) an agreed ``schedule`` as the group's next call: it
        takes its sequence number here, and the watchdog its record. ``compute``: a pipeline's
        GEMM steps (conccl.schedule.pipeline)."""
        seq = self.seq + 1
        flight = None
        if self.watchdog is not None and self.options.checks:
            flight = Flight(seq, f"conccl {schedule.collective}", timeout_s, None, None, schedule, self._late_verdict)
        try:
            with self._lock:  # the watchdog releases under this lock: no call slips in between
                self.check_usable()
                self.executor.ensure_workspace(schedule.workspace_need)
                self.seq = seq
                if compute is None:
                    work = self.executor.run(schedule, input, output, seq, async_op, timeout_s, flight, views)
                else:  # a pipeline (conccl.schedule.pipeline): the caller's GEMM steps run inside it
                    work = self.executor.run(schedule, input, output, seq, async_op, timeout_s, flight, views,
                                             compute=compute)
        except PostedMismatch as e:  # the reference executor compares posted rows while it waits
            self.agreement.posted_mismatch(e)
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
    def check_usable(self) -> None:
        """Raise GroupBroken (with the first failure as its cause) once the group is broken."""
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
        self.local_steps.forget()
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
