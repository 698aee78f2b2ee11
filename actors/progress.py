"""Console progress of one phase (a turn) of a run: rows written of rows planned, and an ETA.

Rows cost very different times: a replayed shard decodes each of its samples once (one trace
collection scores all its configurations, for every draft of the target), a live shard decodes
every SD row and each sample's target once (its AR rows, whose decode the replay check reuses).
So progress is measured in *decodes*, the ETA is the decodes left over a smoothed rate of
decodes per second. On a terminal it is a tqdm bar; in a log (`ray job logs`, a file) it is one
line per finished shard.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Sequence, TextIO

from tqdm import tqdm

from pipeline.planning.grid import Shard

SMOOTHING = 0.3  # weight of the latest interval in the rate (tqdm's convention)


def decodes(shard: Shard) -> int:
    """What a shard costs, in decodes of one sample."""
    samples = len(shard.sample_ids)
    if shard.mode == "replay":
        return samples
    speculative = [sid for config, sid in shard.items if not config.decode.is_ar]
    # one target decode per sample: its AR row, which its replay check reuses, or the check's own
    target = {sid for config, sid in shard.items if config.decode.is_ar or config.decode.greedy}
    return len(speculative) + len(target)


class Progress:
    """Rows and decodes of a phase's planned shards; `advance` after each written shard."""

    def __init__(self, label: str, shards: Sequence[Shard], stream: TextIO = sys.stdout) -> None:
        self.label, self.stream = label, stream
        self.shards, self.rows_total = len(shards), sum(len(s.items) for s in shards)
        self.cost_total = sum(decodes(s) for s in shards)
        self.done = self.rows = self.cost = 0
        self.rate: float | None = None  # decodes per second, smoothed
        self.last = time.monotonic()
        self.bar = tqdm(total=self.cost_total, desc=f"[{label}]", unit="decode", file=stream,
                        smoothing=SMOOTHING,
                        dynamic_ncols=True) if _is_terminal(stream) else None

    def advance(self, shard: Shard, rows: int) -> None:
        now, cost = time.monotonic(), decodes(shard)
        interval = max(now - self.last, 1e-9)
        latest = cost / interval
        self.rate = latest if self.rate is None else SMOOTHING * latest + (1 - SMOOTHING) * self.rate
        self.done, self.rows, self.cost, self.last = self.done + 1, self.rows + rows, self.cost + cost, now
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.rows}/{self.rows_total} rows", refresh=False)
            self.bar.update(cost)
            if self.done == self.shards:
                self.bar.close()
            return
        print(f"[{self.label}] {self.done}/{self.shards} shards, {self.rows}/{self.rows_total} rows, "
              f"{self.rate:.2f} decodes/s, ETA {self.eta()}", file=self.stream, flush=True)

    def split(self, more_shards: int) -> None:
        """A planned shard now runs as `more_shards` + 1 (its samples set apart after a worker
        died): the same rows and decodes, in more shards."""
        self.shards += more_shards

    def eta(self) -> str:
        """Decodes left over the smoothed rate, as H:MM:SS."""
        left = self.cost_total - self.cost
        seconds = 0 if left <= 0 or not self.rate else left / self.rate
        seconds = int(math.ceil(seconds))
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _is_terminal(stream: TextIO) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())
