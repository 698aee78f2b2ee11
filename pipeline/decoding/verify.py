"""Acceptance rules (SPEC §1): which draft proposals the target keeps, and the token it adds."""
from __future__ import annotations

import torch


def verify_greedy(proposals: torch.Tensor, target_probs: torch.Tensor) -> tuple[int, int]:
    """Accept proposals while they equal the target's argmax; return (accepted, next token).

    `proposals` `[g]`, `target_probs` `[g+1, V]` (row i = target distribution before proposal
    i; row g is the bonus position). The next token is the target's own choice at the first
    mismatch, or the bonus token when all g were accepted — so the output is the target's
    greedy output whatever the draft proposed.
    """
    target_ids = target_probs.argmax(-1)
    matches = (proposals == target_ids[:-1]).long()
    accepted = int(matches.cumprod(0).sum())
    return accepted, int(target_ids[accepted])


def verify_sampling(
    proposals: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Speculative sampling: accept y with prob min(1, p(y)/q(y)), else resample from
    norm(max(0, p - q)). `draft_probs` `[g, V]` must be the distribution each proposal was
    sampled from (for an ensemble: the mixture). The emitted tokens are distributed exactly as
    sampling from the target."""
    g = proposals.shape[0]
    for i in range(g):
        token = int(proposals[i])
        p, q = float(target_probs[i, token]), float(draft_probs[i, token])
        u = float(torch.rand((), generator=generator))
        if u * q < p:  # u < p/q without dividing by a zero q
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)
        total = residual.sum()
        # p == q everywhere leaves no residual mass; then rejection has probability 0 anyway
        dist = residual / total if total > 0 else target_probs[i]
        return i, sample_token(dist, generator)
    return g, sample_token(target_probs[g], generator)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from a distribution, with a CPU generator so results do not depend on device."""
    return int(torch.multinomial(probs.double().cpu(), 1, generator=generator))
