"""A host-side exchange board in shared memory for the ranks of one node.

Copy engines cannot make a transfer's size depend on data in GPU memory, so what only the
host knows and every peer needs (an all-to-all's split sizes on every rank) is exchanged
here, before anything is queued. One row per rank and exchange, in a ring of ``PAGES``
pages: a rank publishes into a page only once every peer has read what it held (each rank's
*consumed* count), so a row is never overwritten while read.

An exchange waits for every peer's row. A *post* does not: a call that repeats a call every
rank made the same way before (``Group``'s settled calls) publishes its row and goes on as if
the peers' rows were the earlier ones, and the rows the peers did publish are compared later,
at this rank's next exchange or post; a difference raises :class:`PostedMismatch`. So the
hosts of a group need not meet at every call, as NCCL's never do, and a mismatch is still
caught, one call late.

The board also carries what keeps a group from hanging: every rank's process id (so a
waiting rank can tell a slow peer from a dead one) and an *abort word*: the first rank that
gives up on the group writes who, when and why, and every peer sees it on its next exchange
and fails at once instead of waiting for its own timeout.
"""
from __future__ import annotations

import array
import collections
import os
import time

import numpy as np

from ..device import shm
from ..errors import CollectiveError, CollectiveTimeout, GroupBroken

_HEADER = 2  # the row's exchange number, and whether it was posted without waiting (post())
# Pages of rows, in a ring: a rank may publish up to PAGES exchanges ahead of what its
# slowest peer has read (its consumed count).
PAGES = 16
# Control block after the rows: abort word (aborting rank + 1), its sequence number, reason,
# bit mask of the ranks it waited for; then (pid, pid namespace) per rank.
_A_BY, _A_SEQ, _A_KIND, _A_MISSING, _NCTRL = range(5)
ABORT_TIMEOUT, ABORT_EXITED, ABORT_OTHER = 1, 2, 3
_REASONS = {ABORT_TIMEOUT: "it timed out waiting for rank(s) {}", ABORT_EXITED: "the process of rank(s) {} exited",
            ABORT_OTHER: "it failed ({} missing)"}
_LIVENESS_EVERY_S = 0.1


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def process_alive(pid: int) -> bool:
    """False only when ``pid`` (in this PID namespace) has surely exited (zombies count as exited)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


class PostedMismatch(CollectiveError):
    """A row posted without waiting (:meth:`HostBoard.post`) was not what every peer
    published for that exchange: the call went ahead on rows some rank did not have."""

    def __init__(self, what: str, seq: int, rows: np.ndarray, expected: np.ndarray):
        self.what, self.seq, self.rows, self.expected = what, seq, rows, expected
        differ = [p for p in range(len(rows)) if not np.array_equal(rows[p], expected[p])]
        self.ranks = differ
        super().__init__(f"{what} (sequence number {seq}): rank(s) {', '.join(map(str, differ))} made another call "
                         "than the one this rank repeated without waiting for the peers")

    def __reduce__(self):
        return PostedMismatch, (self.what, self.seq, self.rows, self.expected)


class HostBoard:
    def __init__(self, name: str, rank: int, world: int, row_len: int, create: bool):
        self.name, self.rank, self.world, self.row_len = name, rank, world, row_len
        shape = (PAGES, world, _HEADER + row_len)
        rows_words = int(np.prod(shape))
        nbytes = (rows_words + _NCTRL + 3 * world) * 8
        self._shm = shm.create(name, nbytes) if create else shm.attach(name)
        self._owner = create
        words = np.ndarray(rows_words + _NCTRL + 3 * world, dtype=np.int64, buffer=self._shm.buf)
        self._rows = words[:rows_words].reshape(shape)
        self._ctrl = words[rows_words:rows_words + _NCTRL]
        self._procs = words[rows_words + _NCTRL:rows_words + _NCTRL + 2 * world].reshape(world, 2)
        # per rank: the exchange up to which it has read every row (its own posts' included)
        self._consumed = words[rows_words + _NCTRL + 2 * world:]
        # The same words as Python ints, for the per-call path: a numpy reduction or scalar
        # read of a few words costs microseconds, an index into a memoryview tens of
        # nanoseconds (a settled call's post was ~7 us of numpy on a 2-rank board).
        self._mv = memoryview(self._shm.buf)[:nbytes]
        self._w = self._mv.cast("q")
        self._stride = _HEADER + row_len
        self._abort_at = rows_words + _A_BY
        self._consumed_at = rows_words + _NCTRL + 2 * world
        if create:
            words[:] = 0
        self._procs[rank] = (os.getpid(), _pid_namespace())
        self.count = 0
        # posts not yet compared: (count, expected rows as bytes, their columns, what, seq, token)
        self._pending: collections.deque = collections.deque()
        # accept(token, rows): whether a post's call was right on ``rows`` though they are not the
        # ones it assumed (the poster's group replans from them); None: only equal rows are
        self.accept = None
        self.posts = 0  # rows posted so far (for tests and benchmarks)
        self._unread = None  # the exchange whose rows this rank is waiting for (exchange())
        self._compared = 0  # the last post compared (for posted_mismatch on another thread)
        self.last_posted = np.zeros(world, dtype=bool)

    @property
    def closed(self) -> bool:
        return self._ctrl is None

    # ------------------------------------------------------------------ liveness and abort
    def exited_peers(self, ranks=None) -> list[int]:
        """Ranks among ``ranks`` (default: all) whose process has surely exited."""
        ns = _pid_namespace()
        out = []
        for p in range(self.world) if ranks is None else ranks:
            pid, their_ns = (int(v) for v in self._procs[p])
            if p != self.rank and pid and their_ns == ns and not process_alive(pid):
                out.append(p)
        return out

    def abort(self, seq: int, kind: int, missing: list[int]) -> None:
        """Tell every peer that this rank gave up on the group (the first abort wins)."""
        if self._ctrl[_A_BY]:
            return
        self._ctrl[_A_SEQ], self._ctrl[_A_KIND] = seq, kind
        self._ctrl[_A_MISSING] = sum(1 << p for p in missing)
        self._ctrl[_A_BY] = self.rank + 1  # written last: a peer that sees it sees the rest

    def aborted(self) -> GroupBroken | None:
        """The abort a peer (or this rank) left on the board, as an error; None if none."""
        by = self._w[self._abort_at]
        if not by:
            return None
        missing = [p for p in range(self.world) if int(self._ctrl[_A_MISSING]) >> p & 1]
        kind = int(self._ctrl[_A_KIND])
        reason = ("it failed (a call of its own, or one it posted, went wrong)" if kind == ABORT_OTHER and not missing
                  else _REASONS.get(kind, _REASONS[ABORT_OTHER]).format(", ".join(map(str, missing)) or "?"))
        err = GroupBroken(f"rank {by - 1} broke the group at sequence number {int(self._ctrl[_A_SEQ])}: {reason}")
        err.seq, err.missing = int(self._ctrl[_A_SEQ]), missing
        return err

    # ------------------------------------------------------------------ exchange
    def exchange(self, row, what: str, timeout_s: float, seq: int | None = None) -> np.ndarray:
        """Publish ``row`` and return every rank's row (a ``world x len(row)`` int64 array).
        ``last_posted`` then says which ranks posted theirs without waiting (:meth:`post`).

        Raises :class:`CollectiveTimeout` (naming call ``seq``, default the exchange number)
        when a peer has not published within ``timeout_s`` or its process has exited,
        :class:`GroupBroken` when a peer aborted the group, and :class:`PostedMismatch` when
        an earlier posted row's call turns out to have differed on some rank.
        """
        self._check_row(row)
        seq = self.count + 1 if seq is None else seq
        if self._pending:
            self._verify()
        self._publish(row, False, what, seq, timeout_s)
        page = self._rows[self.count % PAGES]
        count = self._unread = self.count
        try:
            # Comparing the own posts meanwhile moves this rank's consumed count: a peer that
            # needs it to publish this very exchange would otherwise wait for good.
            self._wait(lambda: [p for p in range(self.world) if page[p, 0] < count], what, seq, timeout_s,
                       verify=True)
            rows = page[:, _HEADER:_HEADER + len(row)].copy()
            self.last_posted = page[:, 1].astype(bool)
        finally:
            self._unread = None
        self._verify()  # every post before this exchange is published now
        self._consumed[self.rank] = count  # every earlier post compared (or raised) just above
        return rows

    def post(self, row, expected: np.ndarray, what: str, seq: int, timeout_s: float, token=None) -> None:
        """Publish ``row`` without waiting for the peers': the caller goes on as if every rank's
        row were ``expected`` (its own is ``row``), and a later :meth:`exchange`, :meth:`post`
        or :meth:`check_posted` compares what the peers published with it, raising
        :class:`PostedMismatch` where they differ. A rank may run up to ``PAGES`` exchanges
        ahead of what its slowest peer has read; further, this waits (bounded by ``timeout_s``). Where the
        rows differ, ``accept(token, rows)`` (if set) may still accept them: the call ran
        what those rows ask for as well."""
        self._check_row(row)
        if self._pending:
            self._verify()
        self._publish(row, True, what, seq, timeout_s)
        expected = np.asarray(expected, dtype=np.int64)
        # compared as bytes: cheaper than an array comparison, at every call
        self._pending.append((self.count, expected.tobytes(), expected.shape[1], what, seq, token))
        self.posts += 1

    def check_posted(self) -> None:
        """Compare every posted row whose exchange every peer has published by now (raises
        :class:`PostedMismatch` on the first that differs); the rest stay pending."""
        self._verify()

    def posted_mismatch(self) -> "PostedMismatch | None":
        """The first pending post whose peers' rows are published and differ (and ask for
        another plan: ``accept``), or None; removes nothing (for the watchdog's thread: the
        caller's thread compares them at its next call)."""
        for entry in list(self._pending):
            found = self._compare(entry)
            if found is not False:
                return found
        return None

    def _compare(self, entry):
        """One pending post against what the peers published: None where some peer's row is
        not there yet (or the post was compared since, on another thread), False where the
        rows are alike (or ``accept`` takes them), else the :class:`PostedMismatch`."""
        count, expected, ncols, what, seq, token = entry
        w, stride = self._w, self._stride
        first = count % PAGES * self.world * stride
        heads = range(first, first + self.world * stride, stride)
        for h in heads:
            if w[h] < count:
                return None
        got = b"".join([w[h + _HEADER:h + _HEADER + ncols].tobytes() for h in heads])
        # posted_mismatch() on the watchdog's thread: the caller's thread may have compared
        # this post meanwhile and a peer begun to reuse the page (its header is written last)
        if self._compared >= count or any(w[h] != count for h in heads):
            return None
        if got == expected:
            return False
        rows = np.frombuffer(got, dtype=np.int64).reshape(-1, ncols).copy()
        if self.accept is not None and self.accept(token, rows):
            return False
        return PostedMismatch(what, seq, rows, np.frombuffer(expected, dtype=np.int64).reshape(-1, ncols).copy())

    @property
    def pending_posts(self) -> int:
        return len(self._pending)

    def _check_row(self, row) -> None:
        if len(row) > self.row_len:
            raise ValueError(f"row of {len(row)} entries does not fit the board ({self.row_len})")
        broken = self.aborted()
        if broken is not None:
            raise broken

    def _publish(self, row, posted: bool, what: str, seq: int, timeout_s: float) -> None:
        """Write ``row`` as the next exchange's, once every peer has read what that page held
        (the exchange ``PAGES`` before: its ``consumed`` count has passed it)."""
        count = self.count + 1
        need = count - PAGES
        at = self._consumed_at
        if count > PAGES and min(self._w[at:at + self.world]) < need:
            # Peers that have not read the page yet. This rank's own posts there are compared
            # meanwhile (verify): every peer that read the page published those rows too.
            self._wait(lambda: [p for p in range(self.world) if p != self.rank and self._consumed[p] < need],
                       what, seq, timeout_s, verify=True)
        self.count = count
        w = self._w
        h = (count % PAGES * self.world + self.rank) * self._stride
        w[h + _HEADER:h + _HEADER + len(row)] = array.array("q", row)
        w[h + 1] = int(posted)
        w[h] = count  # published last: a peer that sees it sees the row

    def _verify(self) -> None:
        """Compare the pending posts, oldest first, whose rows every peer has published; the
        own ``consumed`` count follows (a peer may then reuse those pages)."""
        while self._pending:
            count = self._pending[0][0]
            found = self._compare(self._pending[0])
            if found is None:
                return
            if found is not False:
                raise found
            self._pending.popleft()
            self._compared = count  # before the consumed count lets a peer reuse the page
            # read up to the next pending post, or everything but an exchange's own rows not
            # read yet (exchange(): a peer must not reuse that page before)
            upto = self._pending[0][0] - 1 if self._pending else self.count
            if self._unread is not None:
                upto = min(upto, self._unread - 1)
            at = self._consumed_at + self.rank
            self._w[at] = max(self._w[at], upto)

    def _wait(self, waiting_for, what: str, seq: int, timeout_s: float, verify: bool = False) -> None:
        """Spin until ``waiting_for()`` (the ranks still awaited) is empty, bounded by ``timeout_s``;
        a peer's abort or exit raises at once. ``verify``: compare the own pending posts
        meanwhile, so that peers waiting for this rank's ``consumed`` count see it move."""
        start = time.monotonic()
        deadline, next_liveness = start + timeout_s, start + _LIVENESS_EVERY_S
        spins = 0
        while True:
            if verify:
                self._verify()
            waiting = waiting_for()
            if not waiting:
                if verify:  # what became comparable while waiting, compared before going on
                    self._verify()
                return
            spins += 1
            if spins > 1000:  # spin first: peers usually arrive within microseconds
                now = time.monotonic()
                if now > next_liveness:
                    next_liveness = now + _LIVENESS_EVERY_S
                    broken = self.aborted()
                    if broken is not None:  # a peer gave up waiting for the same ranks: so do we
                        raise CollectiveTimeout(what, seq, waiting, now - start, self.exited_peers(waiting),
                                                note=str(broken))
                    exited = self.exited_peers(waiting)
                    if exited:
                        raise CollectiveTimeout(what, seq, waiting, now - start, exited)
                if now > deadline:
                    raise CollectiveTimeout(what, seq, waiting, now - start, self.exited_peers(waiting))
                time.sleep(20e-6)

    def close(self) -> None:
        self._rows = self._ctrl = self._procs = self._consumed = None
        self._w.release()
        self._mv.release()
        self._shm.close()
        if self._owner:
            shm.unlink(self._shm)
