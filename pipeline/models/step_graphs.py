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

from typing import Callable, Hashable

import torch
from transformers import StaticCache

# (ids, mask, positions, ...) -> logits, or logits and the hidden states a head reads
Step = Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]


class CapturedStep:
    """One step shape over one static cache: static input buffers, a graph, its output."""

    def __init__(self, step: Step, cache: StaticCache, inputs: tuple[torch.Tensor, ...],
                 pool: tuple[int, int]) -> None:
        self.inputs = tuple(tensor.clone() for tensor in inputs)
        lengths = [layer.cumulative_length for layer in cache.layers]
        saved = [length.clone() for length in lengths]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the main stream, as capture requires
            step(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        torch._foreach_copy_(lengths, saved)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = step(*self.inputs)

    def __call__(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        for buffer, tensor in zip(self.inputs, inputs):
            buffer.copy_(tensor)
        self.graph.replay()
        # the next replay overwrites the output buffers
        return tuple(t.clone() for t in self.out) if isinstance(self.out, tuple) else self.out.clone()


class StepGraphs:
    """A model's captured steps, keyed by cache, input shapes and `variant` (what else changes
    the graph: the logits kept, the hidden states returned); they share one memory pool (steps
    run one at a time and their outputs are copied out at once)."""

    def __init__(self) -> None:
        self._steps: dict[tuple, CapturedStep] = {}
        self._pool: tuple[int, int] | None = None

    def run(self, step: Step, cache: StaticCache, inputs: tuple[torch.Tensor, ...],
            variant: Hashable) -> torch.Tensor | tuple[torch.Tensor, ...]:
        key = (id(cache), tuple(tuple(t.shape) for t in inputs), variant)
        captured = self._steps.get(key)
        if captured is None:
            self._pool = self._pool or torch.cuda.graph_pool_handle()
            captured = self._steps[key] = CapturedStep(step, cache, inputs, self._pool)
        return captured(inputs)

    def forget(self, cache: StaticCache) -> None:
        """Drop the graphs of a cache about to be freed (they point into its tensors)."""
        for key in [k for k in self._steps if k[0] == id(cache)]:
            del self._steps[key]
