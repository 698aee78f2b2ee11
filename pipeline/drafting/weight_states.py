"""Per-sample weight states: what a weight policy (`pipeline.drafting.policies`) keeps between
blocks and how it turns that into weights. Tensors on the decoder's device; the decoder calls
`choose()` before each block and `update(q, p)` with the positions a verified block added.
Kept apart from the policies so grid files validate without torch.
"""
from __future__ import annotations

import torch

from pipeline.drafting.scoring import (
    grid_position_scores, inverse_error_from_errors, method_position_errors, select_grid_candidate,
    simplex_grid,
)


class WeightState:
    """One sample's weights between blocks. When `learns` is False the decoder never calls
    `update`, and skips computing the distributions it would pass."""

    learns: bool = True

    def choose(self) -> torch.Tensor:
        """Weights for the next block: float64 `[m]` on the decoder's device (no host sync)."""
        raise NotImplementedError

    def update(self, q_methods: torch.Tensor, p_target: torch.Tensor) -> None:
        """Add verified positions: each method's `q_methods` `[n, m, V]`, the target's `p_target` `[n, V]`."""
        raise NotImplementedError


class FixedWeights(WeightState):
    """The same weights every block: the static policy, and any single drafting method."""

    learns = False

    def __init__(self, weights: torch.Tensor) -> None:
        self.weights = weights

    def choose(self) -> torch.Tensor:
        return self.weights

    def update(self, q_methods: torch.Tensor, p_target: torch.Tensor) -> None:
        pass


class ScoreWindow:
    """Per-position scores of the verified history, summed over its last `window` positions.

    Every score a built-in policy uses (argmax hit, distance) is a sum over positions, so a
    block costs the scoring of its new positions only and no `[V]`-sized distribution is
    kept: one float64 row per position in a growing buffer on the scores' device.
    """

    def __init__(self, window: int | None) -> None:
        self.window = window
        self._buffer: torch.Tensor | None = None  # [capacity, scores per position]
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def add(self, *columns: torch.Tensor) -> None:
        """Append positions: `[n, k_j]` blocks of columns side by side (any dtype; kept as float64)."""
        n, width = columns[0].shape[0], sum(c.shape[1] for c in columns)
        end = self._length + n
        if self._buffer is None or end > self._buffer.shape[0]:
            grown = torch.zeros(max(2 * end, 64), width, dtype=torch.float64, device=columns[0].device)
            if self._buffer is not None:
                grown[: self._length] = self._buffer[: self._length]
            self._buffer = grown
        rows, start = self._buffer[self._length : end], 0
        for block in columns:
            rows[:, start : start + block.shape[1]] = block
            start += block.shape[1]
        self._length = end

    def totals(self) -> torch.Tensor:
        start = 0 if self.window is None else max(0, self._length - self.window)
        return self._buffer[start : self._length].sum(0)


class GridSearchState(WeightState):
    """TABED MT* (`GridSearchPolicy`): scores every simplex-grid candidate at each position
    (argmax hit and `distance`) and picks by `measure` over the last `window` positions; the
    earliest of tied candidates wins, so `tie` is the order: `simplex_grid`'s (`most_m`) or its
    reverse, which is the authors' `itertools.product` order (`first`)."""

    def __init__(self, initial: torch.Tensor, *, steps: int, measure: str, distance: str,
                 window: int | None, tie: str = "most_m") -> None:
        self.initial, self.measure, self.distance = initial, measure, distance
        grid = simplex_grid(len(initial), steps)
        self.candidates = (grid if tie == "most_m" else grid.flip(0)).to(initial.device)
        self.mixing_candidates = self.candidates.float()  # in the distributions' dtype, converted once
        self.scores = ScoreWindow(window)  # per position: hit and distance of every candidate

    def update(self, q_methods: torch.Tensor, p_target: torch.Tensor) -> None:
        if q_methods.shape[0]:
            self.scores.add(*grid_position_scores(q_methods, p_target, self.mixing_candidates, self.distance))

    def choose(self) -> torch.Tensor:
        if not len(self.scores):
            return self.initial
        hits, dist = self.scores.totals().split(len(self.candidates))
        return select_grid_candidate(hits, dist, self.candidates, self.measure)


class InverseErrorState(WeightState):
    """TABED MTCP* (`InverseErrorPolicy`): each method's `distance` at each position, summed
    over the last `window` positions, into inverse-error weights at `temperature`."""

    def __init__(self, initial: torch.Tensor, *, temperature: float, distance: str,
                 window: int | None) -> None:
        self.initial, self.temperature, self.distance = initial, temperature, distance
        self.errors = ScoreWindow(window)  # per position: each method's distance

    def update(self, q_methods: torch.Tensor, p_target: torch.Tensor) -> None:
        if q_methods.shape[0]:
            self.errors.add(method_position_errors(q_methods, p_target, self.distance))

    def choose(self) -> torch.Tensor:
        if not len(self.errors):
            return self.initial
        return inverse_error_from_errors(self.errors.totals(), self.temperature)
