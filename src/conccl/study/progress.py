"""The measured study's progress line on rank 0."""
from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar on rank 0 (a line per step when not on a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.monotonic()
        self.out, self.tty = sys.stderr, sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        n = 30 * self.done // max(1, self.total)
        el = time.monotonic() - self.t0
        line = f"[{'#' * n}{'.' * (30 - n)}] {self.done}/{self.total} {el:6.0f}s  {label}"
        print(("\r" + line.ljust(100)) if self.tty else line, end="" if self.tty else "\n", file=self.out, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=self.out)

