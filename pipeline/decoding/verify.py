"""Acceptance rules (docs/algorithm.md §1): which draft proposals the target keeps, and the token it adds.

Everything here is device code returning 0-d tensors: the live engine reads the outcome of a
block in one transfer, never one `.item()` per proposal. Random draws are uniforms the caller
takes from a seeded CPU generator, so sampled outputs do not depend on the device.
"""
from __future__ import annotations

import torch


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Next-token distributions from logits at a temperature (0, greedy, reads as 1)."""
    return torch.softmax(logits / (temperature or 1.0), dim=-1)


def verify_greedy(proposals: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept proposals while they equal the target's argmax; return (accepted, next token).

    `proposals` `[g]`, `target_logits` `[g+1, V]` (row i = target scores before proposal i;
    row g is the bonus position). The next token is the target's own choice at the first
    mismatch, or the bonus token when all g were accepted — so the output is the target's
    greedy output whatever the draft proposed.
    """
    target_ids = target_logits.argmax(-1)
    accepted = leading_matches(proposals, target_ids[:-1])
    return accepted, target_ids.index_select(0, accepted.view(1))[0]


def leading_matches(proposals: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """How many proposals equal the reference before the first mismatch (0-d tensor)."""
    return (proposals == reference).long().cumprod(0).sum()


def verify_sampling(
    proposals: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling: accept y with prob min(1, p(y)/q(y)), else resample from
    norm(max(0, p - q)). `draft_probs` `[g, V]` must be the distribution each proposal was
    sampled from (for an ensemble: the mixture); `uniforms` `[g + 1]` float64 (g acceptance
    tests, then one draw for the emitted token). The emitted tokens are distributed exactly as
    sampling from the target."""
    g = proposals.shape[0]
    index = proposals.view(g, 1)
    p_y = target_probs[:g].gather(1, index).squeeze(1).double()
    q_y = draft_probs.gather(1, index).squeeze(1).double()
    accepted = ((uniforms[:g] * q_y) < p_y).long().cumprod(0).sum()  # u < p/q without dividing by a zero q
    residual = (target_probs[:g] - draft_probs).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    # p == q everywhere leaves no residual mass; then rejection has probability 0 anyway
    resample = torch.where(total > 0, residual / total.clamp_min(torch.finfo(residual.dtype).tiny), target_probs[:g])
    choices = torch.cat([resample, target_probs[g:]])  # row g: the bonus position, sampled from p
    row = choices.index_select(0, accepted.view(1))[0]
    return accepted, sample_token(row, uniforms[g])


def sample_token(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One draw from a distribution by inverse CDF of a given uniform in [0, 1) (0-d tensor).

    Tokens of probability 0 are never drawn: the first index whose cumulative mass exceeds
    u * total is always a token with mass.
    """
    cdf = probs.double().cumsum(-1)
    threshold = (uniform.to(cdf.device, cdf.dtype) * cdf[-1]).view(1)
    return torch.searchsorted(cdf, threshold, right=True)[0].clamp_max(probs.shape[-1] - 1)


def sample_tokens(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw from each row of `probs` `[N, V]` by inverse CDF of `uniforms` `[N]`, as
    `sample_token` draws them one at a time (`[N]`)."""
    cdf = probs.double().cumsum(-1)
    thresholds = uniforms.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, thresholds, right=True)[:, 0].clamp_max(probs.shape[-1] - 1)
