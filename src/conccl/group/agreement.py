"""The agreement: every rank's call checked against every other's before anything moves.

A call publishes its local step's row on the host board and reads every peer's (the
*exchange*); :meth:`Agreement.settle` checks that the rows agree (the same collective, dtype,
algorithm, agreed code and capture on every rank, sizes that fit together: else a *mismatch*
raises on every rank alike) and plans from them. The settled plan is a pure function of the
local step and the rows, so rows equal to an earlier call's (but for the sequence number)
reuse its checked schedule and views (``LocalStep.settled``).

A local step whose rows were alike for :data:`POST_AFTER` exchanged calls in a row is
*settled*: its next calls *post* their row (:meth:`~conccl.group.board.HostBoard.post`) and
run the last plan without waiting for the peers' rows, where :func:`plan_own` and the
collective say no peer's row can change the plan unless they disagree
(``Options.post_settled``). The rows the peers did publish are compared at this rank's next
exchange or post: rows that ask for the same plan send the local step back to the exchange
(:meth:`Agreement.accept_posted`); rows that ask for another break the group
(:meth:`Agreement.posted_mismatch`): the posted call ran on rows some rank did not have.
docs/design.md ("The call protocol's words") draws it.
"""
from __future__ import annotations

from typing import Callable, NoReturn

from ..errors import CollectiveError, CollectiveTimeout, GroupBroken, InvalidArgument
from ..schedule.base import DOUBLE_BUFFER_MAX_BYTES, Buf, Copy, Schedule
from . import row as board_row
from .board import HostBoard, PostedMismatch
from .local import MAX_REMEMBERED, LocalStep
from .options import Options
from .row import FLAG_GRAPH, FLAG_IN_PLACE, FLAG_ONE_SHOT, FLAG_SYM_IN, FLAG_SYM_OUT, FLAGS, NFIXED, SEQ

__all__ = ["POST_AFTER", "Agreement", "plan_own", "writes_peers_only_in_workspace"]

# Exchanged calls whose rows (but for the sequence number) were alike, in a row, after which a
# local step's calls post their row instead of waiting for the peers' (Options.post_settled).
POST_AFTER = 2


def plan_own(row, local: LocalStep | None = None) -> bool:
    """Whether no peer's row can change the plan of a call with this rank's ``row`` unless
    they disagree (a mismatch, caught): the flags peers may set differently from call to call
    (a tensor peer-reachable or not, in place or not, one-shot or not) count only where every
    rank sets them (an AND), so with this rank setting none, neither do the peers' offsets
    in their mapped memory. A peer whose tensor moves there may then make the same call.
    A call whose plan reads no tensor kind (``Collective.plan_ignores_tensor_kinds``: an
    all-reduce, an all-gather's staged push) minds the one-shot flag only."""
    ignores = local is not None and local.coll.plan_ignores_tensor_kinds(local.algorithm)
    kinds = 0 if ignores else FLAG_SYM_IN | FLAG_SYM_OUT | FLAG_IN_PLACE
    return not row[FLAGS] & (kinds | FLAG_ONE_SHOT)


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


class Agreement:
    """One group's agreement on its ``board``: :meth:`agree` a call's local step with the
    peers (exchanging or posting its row), :meth:`settle` rows into a plan, and the mismatch
    of a posted call found later (:meth:`posted_mismatch`). ``fail(error)`` breaks the group
    (the group's own); ``options`` is the group's :class:`Options` object, read at every call.
    Sets the board's ``accept`` (:meth:`accept_posted`)."""

    def __init__(self, board: HostBoard, executor, rank: int, world: int, options: Options,
                 fail: Callable[[BaseException], None]):
        self.board, self.executor, self.rank, self.world, self.options = board, executor, rank, world, options
        self._fail = fail
        board.accept = self.accept_posted  # a posted call's rows that differ may still ask for its plan

    def agree(self, local: LocalStep, seq: int, timeout_s: float, one_shot: bool = False, may_post: bool = True,
              peers_fixed: bool = False) -> tuple:
        """(schedule, views) every rank derives from every rank's row for call ``seq``;
        ``one_shot``: this rank would run it one-shot (it does where every rank would). A call
        alike on every rank for the last POST_AFTER calls posts its row and takes the last
        rows' plan without waiting (``Options.post_settled``), unless ``may_post`` is False
        (an agreement that outlives the call: a persistent op's), and only where no peer's
        row can change the plan without this rank's changing too (:func:`plan_own`), or
        ``peers_fixed``: the caller knows every rank passes the same peer-reachable tensors
        at every call (FSDP's homes, made alike on every rank once)."""
        local.row[FLAGS] = (local.row[FLAGS] & ~FLAG_ONE_SHOT) | (FLAG_ONE_SHOT * one_shot)
        posted = local.posted  # once: the watchdog's thread may drop it (accept_posted)
        if may_post and posted is not None and self._post(local, posted, seq, timeout_s):
            return posted[1]
        rows = self._exchange_call(local, seq, timeout_s)
        rows[:, SEQ] -= seq  # the rows as an earlier call with the same peers' arguments saw them
        key = rows.tobytes()
        settled = local.settled.get(key)
        if settled is None:
            rows[:, SEQ] += seq
            settled = self.settle(local, rows, seq)
            rows[:, SEQ] -= seq
            if len(local.settled) >= MAX_REMEMBERED:
                local.settled.clear()
            local.settled[key] = settled
        local.alike = local.alike + 1 if key == local.last_rows else 1
        local.last_rows = key
        local.posted = None
        if (local.alike >= POST_AFTER and self.options.post_settled and (peers_fixed or plan_own(local.row, local))
                and local.coll.plan_fixed_by_own_row(self.world) and writes_peers_only_in_workspace(settled[0])):
            local.posted = (rows, settled)
        return settled

    def _post(self, local: LocalStep, posted: tuple, seq: int, timeout_s: float) -> bool:
        """Post this call's row (``posted``: the rows and plan it assumes); False where it cannot
        be (its own row is not the one agreed, or it would grow the workspace, a collective
        allocation): it then exchanges as any call. A mismatch of an earlier post found
        meanwhile breaks the group."""
        rows, (schedule, _) = posted
        # The own row is the local step's but for the sequence number and the one-shot flag.
        if (not self.options.post_settled or schedule.workspace_need > self.executor.workspace_bytes
                or local.row[FLAGS] != rows[self.rank, FLAGS] or self.executor.capturing()):
            return False
        expected = rows.copy()
        expected[:, SEQ] += seq
        local.row[SEQ] = seq
        try:
            self.board.post(local.row, expected, f"conccl {local.coll.name}", seq, timeout_s, (local, posted[1], seq))
        except PostedMismatch as e:
            self.posted_mismatch(e)
        except (CollectiveTimeout, GroupBroken) as e:
            self._fail(e)
            raise
        return True

    def accept_posted(self, token, rows) -> bool:
        """Whether a posted call (``token``: its local step, the plan it ran, its sequence
        number) ran what every rank's published ``rows`` ask for, though they are not the rows
        it assumed (a peer's tensor moved within its mapped memory, say): the plan from them is
        the same. The local step exchanges again from its next call. Pure but for that; the
        watchdog's thread may call it."""
        local, ran, seq = token
        local.posted, local.alike = None, 0
        try:
            settled = self.settle(local, rows, seq, breaks=False)
            if local.coll.plan_ignores_tensor_kinds(local.algorithm):  # peers' views unread: the schedule decides
                return settled[0] == ran[0]
            return settled == ran
        except Exception:  # noqa: BLE001 - rows no plan comes from: a mismatch, which breaks the group
            return False

    def posted_mismatch(self, e: PostedMismatch) -> NoReturn:
        """An earlier call posted on rows some rank did not have: it may have moved bytes by
        the wrong plan (into this rank's output and the peers' workspaces only), so the group
        breaks, on every rank (the abort word), and this raises."""
        ranks = ", ".join(map(str, e.ranks))
        error = CollectiveError(
            f"{e.what} (sequence number {e.seq}) on rank {self.rank}: rank(s) {ranks} made another call than this "
            "rank, which repeated its earlier call without waiting for the peers (Options.post_settled); its output "
            "is not to be used, and the group is broken. Every rank must make the same calls in the same order.")
        error.seq = e.seq  # the abort names that call: its handles, and later ones, fail
        self._fail(error)
        raise error from e

    def _exchange_call(self, local: LocalStep, seq: int, timeout_s: float):
        """Publish this call on the board and read every rank's row.

        The call takes its sequence number only when it is queued (``Group.execute``): a
        mismatch raises on every rank alike before that, so the ranks stay in step and the
        group usable (unless a peer posted this call: :meth:`settle`).
        """
        local.row[SEQ] = seq
        return self.exchange(local.row, f"conccl {local.coll.name}", timeout_s, seq)

    def exchange(self, row, what: str, timeout_s: float, seq: int | None = None):
        """The board's exchange of ``row`` (every rank's rows, a ``world x len(row)`` int64
        array); a peer that never comes, or an earlier posted call found to have differed,
        breaks the group."""
        try:
            return self.board.exchange(row, what, timeout_s, seq)
        except PostedMismatch as e:
            self.posted_mismatch(e)
        except (CollectiveTimeout, GroupBroken) as e:
            self._fail(e)
            raise

    def settle(self, local: LocalStep, rows, seq: int, breaks: bool = True) -> tuple:
        """(schedule, views) of call ``seq`` from every rank's ``rows``: check that every rank
        made the same call (raising alike on every rank), then plan. ``breaks``: a
        disagreement with a peer that posted its row breaks the group."""
        w = self.world
        peers = board_row.peer_calls(rows, w)
        try:
            if self.options.checks:
                fixed = rows[:, :NFIXED].tolist()
                mine = board_row.agreed_fields(fixed[self.rank])
                if any(board_row.agreed_fields(x) != mine for x in fixed):
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
            self._fail(error)
            raise error from e
        all_flags = board_row.all_flags(rows)
        schedule = local.coll.plan(
            w, self.rank, local.call, peers,
            algorithm=local.coll.algorithm(local.algorithm, bool(all_flags & FLAG_SYM_OUT), local.call, w),
            stream_mode=local.stream_mode, input_symmetric=bool(all_flags & FLAG_SYM_IN),
            output_symmetric=bool(all_flags & FLAG_SYM_OUT), peers_in_place=bool(all_flags & FLAG_IN_PLACE))
        if local.via_peer:  # this rank's own choice (Options): no peer's plan changes
            schedule = local.coll.own_chunk_via_peer(schedule)
        if all_flags & FLAG_ONE_SHOT:  # every rank would: a pure function of the rows, alike everywhere
            shot = local.coll.plan_one_shot(w, self.rank, local.call, peers)
            if shot is not None and shot.workspace_need <= DOUBLE_BUFFER_MAX_BYTES:
                schedule = shot
        return schedule, board_row.peer_views(local.views, rows, all_flags)

    def _disagreement(self, coll, dtype, seq, rows):
        graph = rows[:, FLAGS] & FLAG_GRAPH
        if (graph != graph[self.rank]).any():
            bad = [p for p in range(self.world) if graph[p] != graph[self.rank]]
            raise CollectiveError(
                f"conccl {coll} (sequence number {seq}) on rank {self.rank}: rank {bad[0]} "
                f"{'made it eagerly' if graph[self.rank] else 'captured it into a CUDA graph'} while this rank "
                f"{'captured it into a CUDA graph' if graph[self.rank] else 'made it eagerly'}; every rank must "
                "capture the same calls; nothing was moved")
        for field, what in ((SEQ, "sequence number"), (board_row.COLL, "collective"), (board_row.DTYPE, "dtype"),
                            (board_row.ALGO, "algorithm"), (board_row.ARG, "reduction op")):
            bad = [p for p in range(self.world) if rows[p, field] != rows[self.rank, field]]
            if bad:
                raise CollectiveError(
                    f"conccl {coll} (sequence number {seq}) on rank {self.rank}: rank {bad[0]} called with a different "
                    f"{what} ({board_row.describe(field, rows[bad[0], field], dtype)} vs "
                    f"{board_row.describe(field, rows[self.rank, field], dtype)} here"
                    f"{'; asked per call or by set_options' if field == board_row.ALGO else ''}); nothing was moved")
