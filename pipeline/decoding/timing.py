"""Where a decode's time goes, phase by phase, without waiting for the device inside a block."""
from __future__ import annotations

import time
from collections import defaultdict

import torch


class PhaseTimer:
    """Seconds per phase without waiting for the device inside a block: CUDA events on a GPU
    (read once, in `totals`), the wall clock on a CPU. Phases may nest (`tabed` inside `draft`).
    A phase is a plain object, not a generator context manager: the drafting loop opens one
    per proposal, and its cost lands in the very overhead it measures."""

    def __init__(self, device: torch.device) -> None:
        self.started = time.perf_counter()  # the decode's wall clock starts with its timer
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def phase(self, name: str) -> _Phase:
        return _Phase(self, name)

    def totals(self) -> dict[str, float]:
        if self._events:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                self.seconds[name] += start.elapsed_time(end) / 1000
            self._events.clear()
        return self.seconds


class _Phase:
    """One timed stretch of a `PhaseTimer` (`with timer.phase(name):`)."""

    __slots__ = ("timer", "name", "begin")

    def __init__(self, timer: PhaseTimer, name: str) -> None:
        self.timer, self.name = timer, name

    def __enter__(self) -> None:
        if self.timer.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.begin = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if self.timer.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.timer._events.append((self.name, self.begin, end))
        else:
            self.timer.seconds[self.name] += time.perf_counter() - self.begin
