"""The arithmetic weight policies are built from (docs/algorithm.md §3): distances between a
target distribution and drafting distributions, mixing, scoring a simplex grid of weight
candidates, inverse-error weights and the tie rules. Pure tensor code, no state; every
function stays on the tensors' device, so the live engine never waits for it.
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import torch

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
    `weights` `[m]`, or `[B, m]` for `q_methods` `[B, ..., m, V]` (each request its own).
    A single method is its own distribution (w = 1 multiplies exactly), without a kernel.
    One matrix product; pass `weights` in the distributions' dtype (`mixing_weights`) and it
    is the only kernel: the drafting loop mixes once per proposal."""
    if q_methods.shape[-2] == 1:
        return q_methods[..., 0, :]
    if weights.dtype != q_methods.dtype:
        weights = weights.to(q_methods.dtype)
    extra = q_methods.dim() - weights.dim() - 1  # dims between the requests' and the methods'
    rows = weights.view(*weights.shape[:-1], *[1] * extra, 1, weights.shape[-1])
    return torch.matmul(rows, q_methods).squeeze(-2)


def mixing_weights(weights: torch.Tensor) -> torch.Tensor:
    """A block's weights in the dtype of the distributions they mix (fp32), converted once."""
    return weights.to(torch.float32)


def grid_position_scores(
    q: torch.Tensor, p: torch.Tensor, candidates: torch.Tensor, distance: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position and candidate: argmax hit against the target (bool) and distance, `[n, C]` each.

    `candidates` `[C, m]` in q's dtype. They are scored in chunks so the mixed distributions
    (`chunk x n x V`) stay small even for m=4 (286 candidates) and a 32k vocabulary; one chunk,
    the common case, is a handful of kernels (the drafting loop's overhead is counted in them).
    """
    if candidates.dtype != q.dtype:
        candidates = candidates.to(q.dtype)
    target_ids = p.argmax(-1, keepdim=True)
    log_p = torch.log(p + _EPS)[:, None] if distance == "kl" else None
    chunk = max(1, _MAX_MIXED_ELEMENTS // max(1, q.shape[0] * q.shape[-1]))
    if chunk >= candidates.shape[0]:
        return _score_mixtures(torch.matmul(candidates, q), p, target_ids, log_p, distance)
    parts = [_score_mixtures(torch.matmul(part, q), p, target_ids, log_p, distance)
             for part in candidates.split(chunk)]
    return torch.cat([hits for hits, _ in parts], 1), torch.cat([dist for _, dist in parts], 1)


def _score_mixtures(
    mixed: torch.Tensor, p: torch.Tensor, target_ids: torch.Tensor, log_p: torch.Tensor | None, distance: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hits and D(p_s || each mixture of position s) for `mixed` `[n, c, V]` (contiguous:
    argmax over a strided layout is ~5x slower; overwritten). KL is `kl_divergence` computed
    in place: fewer passes over the `c x V` mixtures (the hot spot of a 286-candidate grid on a
    49k vocabulary). It sums
    p * (log p - log q) like the direct form; sum p log p - sum p log q would be faster still
    but cancels in fp32 when q is close to p, which moves grid ties."""
    hits = mixed.argmax(-1) == target_ids
    if distance == "tvd":
        return hits, total_variation(p[:, None], mixed)
    log_ratio = torch.sub(log_p, mixed.add_(_EPS).log_(), out=mixed)  # log p - log q_w
    return hits, log_ratio.mul_(p[:, None]).sum(-1)  # on a CPU 3-5x faster than the same sum as bmm


def method_position_errors(q: torch.Tensor, p: torch.Tensor, distance: str) -> torch.Tensor:
    """Distance of each method alone from the target, per position: `[n, m]`."""
    return DISTANCE_FUNCTIONS[distance](p.unsqueeze(1), q).double()


def select_grid_candidate(hits: torch.Tensor, dist: torch.Tensor, candidates: torch.Tensor,
                          measure: str) -> torch.Tensor:
    """TABED MT*: the candidate with the best summed hits `[C]` / distances `[C]` on the window.

    Pure device code (no `.item()`), so the live engine picks weights without a host sync.
    """
    if measure == "hard":
        index = _first_true(hits == hits.max())
    elif measure == "soft":
        index = _first_least(dist)
    else:
        index = _first_least(torch.where(hits == hits.max(), dist, torch.inf))
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
    tolerance = least.abs().mul_(_TIE_RTOL).add_(_TIE_ATOL)
    return _first_true(scores <= least.add_(tolerance))


def inverse_error_from_errors(errors: torch.Tensor, temperature: float) -> torch.Tensor:
    """TABED MTCP*: w_i proportional to (1/e_i)^(1/T), e_i = method i's summed distance `[m]`.

    docs/algorithm.md §3: the paper writes softmax(1/e; T) but the reference computes this normalised form,
    which produced the paper's numbers. Methods with zero error share all the weight (all zero:
    uniform).
    """
    perfect = errors <= 0
    shared = perfect.double() / perfect.sum().clamp_min(1)
    # NaN if some e_i = 0: not chosen then
    inverse = torch.softmax(torch.log(1.0 / errors) / temperature, dim=0)
    return torch.where(perfect.any(), shared, inverse)
