"""A host-side exchange board in shared memory for the ranks of one node.

Copy engines cannot make a transfer's size depend on data in GPU memory, so what only the
host knows and every peer needs (an all-to-all's split sizes on every rank) is exchanged
here, before anything is queued. One row per rank, double-buffered by call parity: a rank can
only be one exchange ahead of the slowest peer, so a row is never overwritten while read.
"""
from __future__ import annotations

import time

import numpy as np

from . import _shm
from .errors import CollectiveTimeout

_HEADER = 1  # the row's exchange number


class HostBoard:
    def __init__(self, name: str, rank: int, world: int, row_len: int, create: bool):
        self.name, self.rank, self.world, self.row_len = name, rank, world, row_len
        shape = (2, world, _HEADER + row_len)
        nbytes = int(np.prod(shape)) * 8
        self._shm = _shm.create(name, nbytes) if create else _shm.attach(name)
        self._owner = create
        self._rows = np.ndarray(shape, dtype=np.int64, buffer=self._shm.buf)
        if create:
            self._rows[:] = 0
        self.count = 0

    def exchange(self, row, what: str, timeout_s: float) -> np.ndarray:
        """Publish ``row`` and return every rank's row (a ``world x len(row)`` int64 array)."""
        if len(row) > self.row_len:
            raise ValueError(f"row of {len(row)} entries does not fit the board ({self.row_len})")
        self.count += 1
        page = self._rows[self.count % 2]
        page[self.rank, _HEADER:_HEADER + len(row)] = row
        page[self.rank, 0] = self.count  # published last: a peer that sees it sees the row
        deadline = time.monotonic() + timeout_s
        start, spins = time.monotonic(), 0
        while True:
            waiting = [p for p in range(self.world) if page[p, 0] < self.count]
            if not waiting:
                return page[:, _HEADER:_HEADER + len(row)].copy()
            spins += 1
            if spins > 1000:
                if time.monotonic() > deadline:
                    raise CollectiveTimeout(what, self.count, waiting, time.monotonic() - start)
                time.sleep(20e-6)

    def close(self) -> None:
        self._rows = None
        self._shm.close()
        if self._owner:
            _shm.unlink(self._shm)
