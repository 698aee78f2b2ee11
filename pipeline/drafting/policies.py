"""Ensemble weight policies (SPEC §3): pure tensor code, usable without any model.

A policy sees the history of positions where both the target distribution `p` and every
drafting method's distribution `q_i` were computed from the true prefix, and returns the
weights `w` (one per method) to mix the methods with for the next block. The same code serves
the live engine and trace replay, which is what makes replay exact.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from pipeline.decoding.config import PolicySpec

_EPS = 1e-12  # keeps log() finite where a probability underflows to 0
_MAX_MIXED_ELEMENTS = 2**25  # bound on candidate-mixture elements held at once
_TIE_RTOL, _TIE_ATOL = 1e-5, 1e-7  # scores closer than this are ties (fp32 rounding, ~1e-7 relative)


@dataclass
class History:
    """Past (q_1..q_m, p) pairs, one per verified position, oldest first.

    `q`: list of `[m, V]` tensors (per-method distributions), `p`: list of `[V]` tensors.
    Kept per position so a window is a slice; stacked lazily when a policy needs them.
    """

    q: list[torch.Tensor] = field(default_factory=list)
    p: list[torch.Tensor] = field(default_factory=list)

    def add(self, q_methods: torch.Tensor, p_target: torch.Tensor) -> None:
        """Append positions: `q_methods` `[n, m, V]`, `p_target` `[n, V]`."""
        self.q.extend(q_methods.unbind(0))
        self.p.extend(p_target.unbind(0))

    def __len__(self) -> int:
        return len(self.p)

    def window(self, h: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last `h` positions (all when None) as `q [H, m, V]`, `p [H, V]`."""
        start = 0 if h is None else max(0, len(self.p) - h)
        return torch.stack(self.q[start:]), torch.stack(self.p[start:])


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim (target first, SPEC §3)."""
    return (p * (torch.log(p + _EPS) - torch.log(q + _EPS))).sum(-1)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """0.5 * sum |p - q| over the last dim."""
    return 0.5 * (p - q).abs().sum(-1)


DISTANCE_FUNCTIONS = {"kl": kl_divergence, "tvd": total_variation}


@lru_cache(maxsize=None)
def simplex_grid(m: int, steps: int) -> torch.Tensor:
    """All weight vectors on the simplex with step 1/steps, `[N, m]`, in a fixed order.

    For m=2 the order is [1-j/n, j/n] for j = 0..n, as SPEC §3 lists it: ties resolve to the
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
    """Ensemble distribution sum_i w_i q_i (probabilities, not logits): `[..., m, V]` -> `[..., V]`."""
    return torch.einsum("...mv,m->...v", q_methods, weights.to(q_methods.device, q_methods.dtype))


def _score_candidates(
    q: torch.Tensor, p: torch.Tensor, candidates: torch.Tensor, distance: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per candidate: argmax hits against the target and summed distance, `[C]` each.

    Candidates are scored in chunks so the mixed distributions (`chunk x H x V`) stay small
    even for m=4 (286 candidates) and a 32k vocabulary.
    """
    target_ids = p.argmax(-1)
    chunk = max(1, _MAX_MIXED_ELEMENTS // max(1, q.shape[0] * q.shape[-1]))
    hits, dist = [], []
    for part in candidates.to(q.dtype).split(chunk):
        mixed = torch.einsum("hmv,cm->chv", q, part)  # [c, H, V]
        hits.append((mixed.argmax(-1) == target_ids).sum(-1))
        dist.append(DISTANCE_FUNCTIONS[distance](p, mixed).sum(-1))
    return torch.cat(hits), torch.cat(dist)


def grid_weights(q: torch.Tensor, p: torch.Tensor, spec: PolicySpec) -> torch.Tensor:
    """TABED MT*: the simplex-grid candidate that best matched the target on the window."""
    candidates = simplex_grid(q.shape[1], spec.steps).to(q.device)
    # hard+soft breaks ties by summed KL whatever `distance` says (SPEC §3)
    distance = "kl" if spec.measure == "hard+soft" else spec.distance
    hits, dist = _score_candidates(q, p, candidates, distance)
    if spec.measure == "soft":
        return candidates[_first_least(dist)]
    best = hits == hits.max()
    if spec.measure == "hard":
        return candidates[int(torch.nonzero(best)[0])]
    dist = torch.where(best, dist, torch.full_like(dist, float("inf")))
    return candidates[_first_least(dist)]


def _first_least(scores: torch.Tensor) -> int:
    """Index of the earliest candidate within float noise of the least score.

    Mixtures that are mathematically equal (e.g. M and T rows of a prompt with no image) score
    equal up to rounding, which differs with tensor shapes; without a tolerance the winner
    would depend on that noise, and trace replay could not reproduce live runs.
    """
    least = scores.min()
    tolerance = _TIE_RTOL * least.abs() + _TIE_ATOL
    return int(torch.nonzero(scores <= least + tolerance)[0])


def inverse_error_weights(q: torch.Tensor, p: torch.Tensor, spec: PolicySpec) -> torch.Tensor:
    """TABED MTCP*: w_i proportional to (1/e_i)^(1/T), e_i = method i's summed distance.

    SPEC §3: the paper writes softmax(1/e; T) but the reference computes this normalised form,
    which produced the paper's numbers. Methods with zero error share all the weight (all zero:
    uniform).
    """
    errors = DISTANCE_FUNCTIONS[spec.distance](p.unsqueeze(1), q).sum(0).double()  # [m]
    perfect = errors <= 0
    if perfect.any():
        return perfect.double() / perfect.sum()
    return torch.softmax(torch.log(1.0 / errors) / spec.temperature, dim=0)


def choose_weights(history: History, m: int, spec: PolicySpec) -> torch.Tensor:
    """Weights w* for the next block, float64 `[m]` on the CPU (uniform before any history)."""
    if m == 1:
        return torch.ones(1, dtype=torch.float64)
    if spec.kind == "static" or len(history) == 0:
        return uniform_weights(m)
    q, p = history.window(spec.window)
    if spec.kind == "grid":
        return grid_weights(q, p, spec).cpu()
    return inverse_error_weights(q, p, spec).cpu()
