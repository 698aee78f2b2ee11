"""Where a decode's time goes, phase by phase, without waiting for the device inside a block."""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from pipeline.models.devices import energy_meter


class PhaseTimer:
    """Seconds per phase without waiting for the device inside a block: CUDA events on a GPU
    (read once, in `totals`), the wall clock on a CPU. Phases may nest (`tabed` inside `draft`).
    A phase is a plain object, not a generator context manager: the drafting loop opens one
    per proposal, and its cost lands in the very overhead it measures."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._meter = energy_meter(device)  # None: energy unmeasured here
        if self._meter is not None:
            if self.cuda:
                torch.cuda.synchronize()  # the decode's energy starts with its timer, on an idle device
            self._energy_start = self._meter()
        self.started = time.perf_counter()  # the decode's wall clock starts with its timer

    def phase(self, name: str) -> _Phase:
        return _Phase(self, name)

    def totals(self) -> dict[str, float]:
        if self._events:
            torch.cuda.synchronize()
            for name, start, end in self._events:
                self.seconds[name] += start.elapsed_time(end) / 1000
            self._events.clear()
        return self.seconds

    def energy_j(self) -> float | None:
        """Joules the device used since the timer started (call after `totals`, which waits for
        the device); None where no energy counter can be read."""
        return None if self._meter is None else self._meter() - self._energy_start


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
