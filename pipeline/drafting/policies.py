"""Ensemble weight policies (docs/algorithm.md §3): pure tensor code, usable without any model.

A policy sees the history of positions where both the target distribution `p` and every
drafting method's distribution `q_i` were computed from the true prefix, and returns the
weights `w` (one per method) to mix the methods with for the next block. The same code serves
the live engine and trace replay, which is what makes replay exact.
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import torch

from pipeline.drafting.policy_spec import PolicySpec

_EPS = 1e-12  # keeps log() finite where a probability underflows to 0
_MAX_MIXED_ELEMENTS = 2**25  # bound on candidate-mixture elements held at once
_TIE_RTOL, _TIE_ATOL = 1e-5, 1e-7  # scores closer than this are ties (fp32 rounding, ~1e-7 relative)


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim (target first, docs/algorithm.md §3)."""
    return (p * (torch.log(p + _EPS) - torch.log(q + _EPS))).sum(-1)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """0.5 * sum |p - q| over the last dim."""
    return 0.5 * (p - q).abs().sum(-1)


DISTANCE_FUNCTIONS = {"kl": kl_divergence, "tvd": total_variation}


@lru_cache(maxsize=None)
def simplex_grid(m: int, steps: int) -> torch.Tensor:
    """All weight vectors on the simplex with step 1/steps, `[N, m]`, in a fixed order.

    For m=2 the order is [1-j/n, j/n] for j = 0..n, as docs/algorithm.md §3 lists it: ties resolve to the
    earliest candidate in this order.
    """
    points = [
        (steps - sum(rest),) + rest
        for rest in itertools.product(range(steps + 1), repeat=m - 1)
        if sum(rest) <= steps
    ]
    points.sort(key=lambda w: tuple(-x for x in w))
    return torch.tensor(points, dtype=torch.float64) / steps


def uniform_weights(m: int) -> torch.Tensor:
    return torch.full((m,), 1.0 / m, dtype=torch.float64)


def mix(q_methods: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Ensemble distribution sum_i w_i q_i (probabilities, not logits): `[..., m, V]` -> `[..., V]`.
    A single method is its own distribution (w = 1 multiplies exactly), without a kernel."""
    if q_methods.shape[-2] == 1:
        return q_methods[..., 0, :]
    return torch.einsum("...mv,m->...v", q_methods, weights.to(q_methods.device, q_methods.dtype))


def grid_position_scores(
    q: torch.Tensor, p: torch.Tensor, candidates: torch.Tensor, distance: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position and candidate: argmax hit against the target and distance, `[n, C]` each.

    Candidates are scored in chunks so the mixed distributions (`chunk x n x V`) stay small
    even for m=4 (286 candidates) and a 32k vocabulary.
    """
    target_ids = p.argmax(-1)
    chunk = max(1, _MAX_MIXED_ELEMENTS // max(1, q.shape[0] * q.shape[-1]))
    hits, dist = [], []
    for part in candidates.to(q.dtype).split(chunk):
        mixed = torch.matmul(part, q)  # [n, c, V], contiguous: argmax over a strided layout is ~5x slower
        hits.append(mixed.argmax(-1) == target_ids[:, None])
        dist.append(_distance_to_mixtures(p, mixed, distance))
    return torch.cat(hits, 1).double(), torch.cat(dist, 1).double()


def _distance_to_mixtures(p: torch.Tensor, mixed: torch.Tensor, distance: str) -> torch.Tensor:
    """D(p_s || each mixture of position s): `p [n, V]`, `mixed [n, c, V]` (overwritten) -> `[n, c]`.

    KL is `kl_divergence` computed in place with one batched product for the weighted sum:
    fewer passes over the `c x V` mixtures (the hot spot of a 286-candidate grid on a 49k
    vocabulary). It sums p * (log p - log q) like the direct form; sum p log p - sum p log q
    would be faster still but cancels in fp32 when q is close to p, which moves grid ties.
    """
    if distance == "tvd":
        return total_variation(p[:, None], mixed)
    log_ratio = mixed.add_(_EPS).log_().neg_().add_(torch.log(p + _EPS)[:, None])  # log p - log q_w
    return torch.bmm(log_ratio, p.unsqueeze(-1)).squeeze(-1)


def method_position_errors(q: torch.Tensor, p: torch.Tensor, distance: str) -> torch.Tensor:
    """Distance of each method alone from the target, per position: `[n, m]`."""
    return DISTANCE_FUNCTIONS[distance](p.unsqueeze(1), q).double()


def select_grid_candidate(hits: torch.Tensor, dist: torch.Tensor, candidates: torch.Tensor, measure: str) -> torch.Tensor:
    """TABED MT*: the candidate with the best summed hits `[C]` / distances `[C]` on the window.

    Pure device code (no `.item()`), so the live engine picks weights without a host sync.
    """
    if measure == "soft":
        index = _first_least(dist)
    else:
        best = hits == hits.max()
        if measure == "hard":
            index = _first_true(best)
        else:
            index = _first_least(torch.where(best, dist, torch.full_like(dist, float("inf"))))
    return candidates.index_select(0, index.view(1))[0]


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True, as a 0-d device tensor (argmax returns the first maximum)."""
    return mask.to(torch.uint8).argmax()


def _first_least(scores: torch.Tensor) -> torch.Tensor:
    """Index of the earliest candidate within float noise of the least score.

    Mixtures that are mathematically equal (e.g. M and T rows of a prompt with no image) score
    equal up to rounding, which differs with tensor shapes; without a tolerance the winner
    would depend on that noise, and trace replay could not reproduce live runs.
    """
    least = scores.min()
    tolerance = _TIE_RTOL * least.abs() + _TIE_ATOL
    return _first_true(scores <= least + tolerance)


def inverse_error_from_errors(errors: torch.Tensor, temperature: float) -> torch.Tensor:
    """TABED MTCP*: w_i proportional to (1/e_i)^(1/T), e_i = method i's summed distance `[m]`.

    docs/algorithm.md §3: the paper writes softmax(1/e; T) but the reference computes this normalised form,
    which produced the paper's numbers. Methods with zero error share all the weight (all zero:
    uniform).
    """
    perfect = errors <= 0
    shared = perfect.double() / perfect.sum().clamp_min(1)
    inverse = torch.softmax(torch.log(1.0 / errors) / temperature, dim=0)  # NaN if some e_i = 0: not chosen then
    return torch.where(perfect.any(), shared, inverse)


def _grid_distance(spec: PolicySpec) -> str:
    # hard+soft breaks ties by summed KL whatever `distance` says (docs/algorithm.md §3)
    return "kl" if spec.measure == "hard+soft" else spec.distance


class History:
    """What a dynamic policy remembers of past verified positions: only the per-position scores
    it sums over its window, computed once when a position is added.

    Positions are those where both the target's `p` and every method's `q_i` were computed from
    the true prefix (docs/algorithm.md §3). Every score (argmax hit, distance) is a sum over positions, so a
    block costs the scoring of its new positions only, not of the whole history again, and no
    `[V]`-sized distribution is kept. Scores stay on the history's device, which must be the
    distributions' (one float64 row per position in a growing buffer), so the live engine
    never waits for them. Static policies and single methods keep nothing.
    """

    def __init__(self, m: int, spec: PolicySpec, device: torch.device | str = "cpu") -> None:
        self.m, self.spec = m, spec
        self.tracks = spec.kind != "static" and m > 1
        # made on the device once, so that choosing weights never copies from the host
        self.initial_weights = (torch.ones(1, dtype=torch.float64) if m == 1 else uniform_weights(m)).to(device)
        self.candidates = simplex_grid(m, spec.steps).to(device) if spec.kind == "grid" and self.tracks else None
        self._buffer: torch.Tensor | None = None  # [capacity, scores per position]
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def add(self, q_methods: torch.Tensor, p_target: torch.Tensor) -> None:
        """Append positions: `q_methods` `[n, m, V]`, `p_target` `[n, V]`."""
        if not self.tracks or q_methods.shape[0] == 0:
            return
        if self.candidates is not None:
            hits, dist = grid_position_scores(q_methods, p_target, self.candidates, _grid_distance(self.spec))
            rows = torch.cat([hits, dist], 1)
        else:
            rows = method_position_errors(q_methods, p_target, self.spec.distance)
        self._append(rows)

    def _append(self, rows: torch.Tensor) -> None:
        end = self._length + rows.shape[0]
        if self._buffer is None or end > self._buffer.shape[0]:
            grown = rows.new_zeros(max(2 * end, 64), rows.shape[1])
            if self._buffer is not None:
                grown[: self._length] = self._buffer[: self._length]
            self._buffer = grown
        self._buffer[self._length : end] = rows
        self._length = end

    def window_totals(self) -> torch.Tensor:
        """Scores summed over the last `window` positions (all when None)."""
        h = self.spec.window
        start = 0 if h is None else max(0, self._length - h)
        return self._buffer[start : self._length].sum(0)


def choose_weights(history: History) -> torch.Tensor:
    """Weights w* for the next block, float64 `[m]` on the history's device: uniform (1 for a
    single method) until the history holds positions."""
    if not history.tracks or len(history) == 0:
        return history.initial_weights
    spec = history.spec
    totals = history.window_totals()
    if history.candidates is not None:
        hits, dist = totals.split(len(history.candidates))
        return select_grid_candidate(hits, dist, history.candidates, spec.measure)
    return inverse_error_from_errors(totals, spec.temperature)
