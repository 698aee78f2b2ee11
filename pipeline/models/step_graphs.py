"""Decode steps replayed as CUDA graphs, captured by hand once per (static cache, step shape).

A replayed step is three input copies and one graph launch: no Python model code runs and no
Dynamo guards are checked. `torch.compile(mode="reduce-overhead")` also replays CUDA graphs,
but checks its guards (every tensor of the static cache, every shape already compiled) on
each call; on an H100 that took longer than a small draft's whole step on the device.

The captured forward may itself be compiled (inductor kernels, no Dynamo at replay). It writes
the step's keys and values into the static cache at the cache's write position, which is a
device tensor, so one graph serves every position. Warming up runs the step once for real;
its cache writes land past the valid length and are undone by restoring the write positions.
"""
from __future__ import annotations

from typing import Callable

import torch
from transformers import StaticCache

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (ids, mask, positions) -> logits


class CapturedStep:
    """One step shape over one static cache: static input buffers, a graph, its output."""

    def __init__(self, step: Step, cache: StaticCache, ids: torch.Tensor, mask: torch.Tensor,
                 positions: torch.Tensor, pool: tuple[int, int]) -> None:
        self.ids, self.mask, self.positions = ids.clone(), mask.clone(), positions.clone()
        lengths = [layer.cumulative_length for layer in cache.layers]
        saved = [length.clone() for length in lengths]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the main stream, as capture requires
            step(self.ids, self.mask, self.positions)
        torch.cuda.current_stream().wait_stream(side)
        torch._foreach_copy_(lengths, saved)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = step(self.ids, self.mask, self.positions)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.ids.copy_(ids)
        self.mask.copy_(mask)
        self.positions.copy_(positions)
        self.graph.replay()
        return self.logits.clone()  # the next replay overwrites the output buffer


class StepGraphs:
    """A model's captured steps, keyed by cache and step shape; they share one memory pool
    (steps run one at a time and their outputs are copied out at once)."""

    def __init__(self) -> None:
        self._steps: dict[tuple[int, tuple[int, ...], int], CapturedStep] = {}
        self._pool: tuple[int, int] | None = None

    def run(self, step: Step, cache: StaticCache, ids: torch.Tensor, mask: torch.Tensor,
            positions: torch.Tensor, keep: int) -> torch.Tensor:
        key = (id(cache), tuple(ids.shape), keep)
        captured = self._steps.get(key)
        if captured is None:
            self._pool = self._pool or torch.cuda.graph_pool_handle()
            captured = self._steps[key] = CapturedStep(step, cache, ids, mask, positions, self._pool)
        return captured(ids, mask, positions)

    def forget(self, cache: StaticCache) -> None:
        """Drop the graphs of a cache about to be freed (they point into its tensors)."""
        for key in [k for k in self._steps if k[0] == id(cache)]:
            del self._steps[key]
