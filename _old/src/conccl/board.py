"""A host-side exchange board in shared memory for the ranks of one node.

Copy engines cannot make a transfer's size depend on data in GPU memory, so what only the
host knows and every peer needs (an all-to-all's split sizes on every rank) is exchanged
here, before anything is queued. One row per rank, double-buffered by call parity: a rank can
only be one exchange ahead of the slowest peer, so a row is never overwritten while read.

The board also carries what keeps a group from hanging: every rank's process id (so a
waiting rank can tell a slow peer from a dead one) and an *abort word*: the first rank that
gives up on the group writes who, when and why, and every peer sees it on its next exchange
and fails at once instead of waiting for its own timeout.
"""
from __future__ import annotations

import os
import time

import numpy as np

from . import _shm
from .errors import CollectiveTimeout, GroupBroken

_HEADER = 1  # the row's exchange number
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


class HostBoard:
    def __init__(self, name: str, rank: int, world: int, row_len: int, create: bool):
        self.name, self.rank, self.world, self.row_len = name, rank, world, row_len
        shape = (2, world, _HEADER + row_len)
        rows_words = int(np.prod(shape))
        nbytes = (rows_words + _NCTRL + 2 * world) * 8
        self._shm = _shm.create(name, nbytes) if create else _shm.attach(name)
        self._owner = create
        words = np.ndarray(rows_words + _NCTRL + 2 * world, dtype=np.int64, buffer=self._shm.buf)
        self._rows = words[:rows_words].reshape(shape)
        self._ctrl = words[rows_words:rows_words + _NCTRL]
        self._procs = words[rows_words + _NCTRL:].reshape(world, 2)
        if create:
            words[:] = 0
        self._procs[rank] = (os.getpid(), _pid_namespace())
        self.count = 0

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
        by = int(self._ctrl[_A_BY])
        if not by:
            return None
        missing = [p for p in range(self.world) if int(self._ctrl[_A_MISSING]) >> p & 1]
        reason = _REASONS.get(int(self._ctrl[_A_KIND]), _REASONS[ABORT_OTHER]).format(", ".join(map(str, missing)) or "?")
        err = GroupBroken(f"rank {by - 1} broke the group at sequence number {int(self._ctrl[_A_SEQ])}: {reason}")
        err.seq, err.missing = int(self._ctrl[_A_SEQ]), missing
        return err

    # ------------------------------------------------------------------ exchange
    def exchange(self, row, what: str, timeout_s: float, seq: int | None = None) -> np.ndarray:
        """Publish ``row`` and return every rank's row (a ``world x len(row)`` int64 array).

        Raises :class:`CollectiveTimeout` (naming call ``seq``, default the exchange number)
        when a peer has not published within ``timeout_s`` or its process has exited, and
        :class:`GroupBroken` when a peer aborted the group.
        """
        if len(row) > self.row_len:
            raise ValueError(f"row of {len(row)} entries does not fit the board ({self.row_len})")
        broken = self.aborted()
        if broken is not None:
            raise broken
        self.count += 1
        page = self._rows[self.count % 2]
        page[self.rank, _HEADER:_HEADER + len(row)] = row
        page[self.rank, 0] = self.count  # published last: a peer that sees it sees the row
        seq = self.count if seq is None else seq
        start = time.monotonic()
        deadline, next_liveness = start + timeout_s, start + _LIVENESS_EVERY_S
        spins = 0
        while True:
            waiting = [p for p in range(self.world) if page[p, 0] < self.count]
            if not waiting:
                return page[:, _HEADER:_HEADER + len(row)].copy()
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
        self._rows = self._ctrl = self._procs = None
        self._shm.close()
        if self._owner:
            _shm.unlink(self._shm)
