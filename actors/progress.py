"""Console progress of a run: one line per finished shard."""
from __future__ import annotations

import math
import sys
import time
from typing import TextIO


class Progress:
    """One console line per finished shard: done/total shards, samples/s, ETA. A sample here
    is one row: a sample decoded (or replayed) under one configuration."""

    def __init__(self, label: str, total: int, stream: TextIO = sys.stdout) -> None:
        self.label, self.total, self.stream = label, total, stream
        self.done = self.rows = 0
        self.start = time.monotonic()

    def advance(self, rows: int) -> None:
        self.done += 1
        self.rows += rows
        elapsed = max(time.monotonic() - self.start, 1e-9)
        eta = elapsed / self.done * (self.total - self.done)
        print(
            f"[{self.label}] {self.done}/{self.total} shards, {self.rows} samples, "
            f"{self.rows / elapsed:.2f} samples/s, ETA {_clock(eta)}",
            file=self.stream, flush=True,
        )


def _clock(seconds: float) -> str:
    seconds = int(math.ceil(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
