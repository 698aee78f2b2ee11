"""Acceptance: which proposals the target keeps, the token it adds, and what a block then
settles into output, for chains and token trees alike (docs/algorithm.md §1, "Token trees").

The rules are device code returning 0-d tensors, so the loop reads a block's outcome in its
one transfer. Random draws are uniforms taken from a seeded CPU generator, so sampled outputs
do not depend on the device. `settle_block` is the one rule live decoding and trace replay
share for what a verified block keeps, records and teaches the history.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from pipeline.decoding.trees import Tree

WEIGHT_DECIMALS = 6  # weights are recorded rounded, identically for live and replayed rows

def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Next-token distributions from logits at a temperature (0, greedy, reads as 1)."""
    return torch.softmax(logits / (temperature or 1.0), dim=-1)


def verify_greedy(proposals: torch.Tensor, target_logits: torch.Tensor,
                  depths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept proposals while they equal the target's argmax; return (accepted, next token), `[B]` each.

    `proposals` `[B, g]`, `target_logits` `[B, g+1, V]` (row i = target scores before proposal
    i; row g is the bonus position). The next token is the target's own choice at the first
    mismatch, or the bonus token when all g were accepted — so the output is the target's
    greedy output whatever the draft proposed. `depths` `[B]`: each request proposed only its
    first ones (a lookup without a match proposes none), the rest are fillers never accepted.
    """
    target_ids = target_logits.argmax(-1)
    accepted = leading_matches(proposals, target_ids[:, :-1])
    if depths is not None:
        accepted = torch.minimum(accepted, depths)
    return accepted, target_ids.gather(1, accepted[:, None])[:, 0]


def leading_matches(proposals: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """How many proposals of each row equal the reference before the first mismatch (`[B]`)."""
    return (proposals == reference).long().cumprod(1).sum(1)


def verify_sampling(
    proposals: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    depths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling: accept y with prob min(1, p(y)/q(y)), else resample from
    norm(max(0, p - q)). `proposals` `[B, g]`; `draft_probs` `[B, g, V]` must be the
    distribution each proposal was sampled from (for an ensemble: the mixture); `uniforms`
    `[B, g + 1]` float64 (g acceptance tests, then one draw for the emitted token). The emitted
    tokens are distributed exactly as sampling from the target. `depths` `[B]`: each request
    proposed only its first ones; past them nothing is accepted and the token is drawn from p
    itself (q = 0 there). Returns `[B]` each."""
    g = proposals.shape[1]
    if depths is not None:
        draft_probs = draft_probs * (torch.arange(g, device=depths.device) < depths[:, None])[..., None]
    index = proposals[..., None]
    p_y = target_probs[:, :g].gather(2, index)[..., 0].double()
    q_y = draft_probs.gather(2, index)[..., 0].double()
    # u < p/q without dividing by a zero q; a token of q 0 (past a depth) was never proposed
    accepted = (((uniforms[:, :g] * q_y) < p_y) & (q_y > 0)).long().cumprod(1).sum(1)
    residual = (target_probs[:, :g] - draft_probs).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    # p == q everywhere leaves no residual mass; then rejection has probability 0 anyway
    normalised = residual / total.clamp_min(torch.finfo(residual.dtype).tiny)
    resample = torch.where(total > 0, normalised, target_probs[:, :g])
    choices = torch.cat([resample, target_probs[:, g:]], 1)  # row g: the bonus position, sampled from p
    row = choices.gather(1, accepted[:, None, None].expand(-1, 1, choices.shape[-1]))[:, 0]
    return accepted, sample_tokens(row, uniforms[:, g])


def sample_tokens(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw from each row of `probs` `[N, V]` by inverse CDF of `uniforms` `[N]` in [0, 1):
    `[N]`. Tokens of probability 0 are never drawn: the first index whose cumulative mass
    exceeds u * total is always a token with mass."""
    cdf = probs.double().cumsum(-1)
    thresholds = uniforms.to(cdf.device, cdf.dtype)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, thresholds, right=True)[:, 0].clamp_max(probs.shape[-1] - 1)


# Token trees: the walk down each request's tree, verified in one forward


@dataclass
class TreeOutcome:
    """What the target accepted, on the device: `accepted` proposals and the target's own
    `next_token` after them (`[B]` each), and `path`, the accepted nodes' fed positions by depth
    (`[B, gamma + 1]`, root first; entries past `accepted` are 0)."""

    accepted: torch.Tensor
    next_token: torch.Tensor
    path: torch.Tensor


def verify_tree_greedy(tree: Tree, target_logits: torch.Tensor) -> TreeOutcome:
    """Follow the target's argmax down the tree (`follow_tree`): the output is the target's
    greedy output whatever the tree holds. `target_logits` `[B, N + 1, V]` at the fed positions."""
    return follow_tree(tree, target_logits.argmax(-1))


def verify_tree_sampled(tree: Tree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> TreeOutcome:
    """SpecExec's rule (as Spec-LLaVA verifies its trees): the target samples one token at every
    fed position (`uniforms` `[B, N + 1]`, one per position), and the walk follows the child
    whose token is the one sampled at its parent. The target's distribution at a node is its
    exact distribution given the path to it, so every emitted token is a draw from the target
    given the tokens before it, however the tree was built: lossless for any tree whose
    siblings differ. `target_probs` `[B, N + 1, V]`."""
    chosen = sample_tokens(target_probs.flatten(0, 1), uniforms[:, : tree.size + 1].flatten())
    return follow_tree(tree, chosen.view(target_probs.shape[:2]))


def follow_tree(tree: Tree, chosen: torch.Tensor) -> TreeOutcome:
    """Walk down from each root: a node is accepted when its token is `chosen` at its parent's
    fed position (`chosen` `[B, N + 1]`) and its parent is accepted (the root always is). At
    most one child per node can match (siblings differ), so the accepted nodes form one path;
    the next token is `chosen` at its deepest node."""
    matches = tree.valid & (tree.tokens == chosen.gather(1, tree.parents))
    accepted, root = matches, matches.new_ones(matches.shape[0], 1)
    for _ in range(tree.gamma - 1):
        accepted = matches & torch.cat([root, accepted], 1).gather(1, tree.parents)
    reach = torch.cat([tree.depths.new_zeros(root.shape), accepted.long() * tree.depths], 1)
    deepest = reach.argmax(1)  # the first maximum: the root when nothing was accepted
    at = deepest[:, None]
    return TreeOutcome(reach.gather(1, at)[:, 0], chosen.gather(1, at)[:, 0], tree.path_to(deepest))


def verify_branches_sampling(
    tree: Tree, branches: int, target_probs: torch.Tensor, proposal_probs: torch.Tensor,
    uniforms: torch.Tensor,
) -> TreeOutcome:
    """Lossless sampling over `branches` independent chains that share only the root (SpecInfer's
    multi-step speculative sampling): the root's children are tested in order, child b accepted
    with probability min(1, p'(c_b) / r_b(c_b)) where r_b is the distribution it was drawn from,
    p' starting as p and becoming norm(max(p' - r_b, 0)) after each rejection; past the root the
    accepted branch is an ordinary chain (`verify_sampling`); when no child is accepted, the
    token is drawn from the last p'. The output is distributed exactly as sampling the target.

    Node (b, d) sits at fed position 1 + b * gamma + d. `target_probs` `[B, N + 1, V]`,
    `proposal_probs` `[B, N, V]`, `uniforms` `[B, branches + gamma]` float64: root tests, then
    the chain's tests and its emitted token."""
    gamma, vocabulary = tree.gamma, target_probs.shape[-1]
    residual = target_probs[:, 0]
    chosen = torch.full(residual.shape[:1], -1, dtype=torch.long, device=target_probs.device)
    for b in range(branches):
        node = b * gamma
        token, drawn_from = tree.tokens[:, node : node + 1], proposal_probs[:, node]
        still_rejecting = chosen < 0
        ratio = (
            uniforms[:, b] * drawn_from.gather(1, token)[:, 0].double()
        ) < residual.gather(1, token)[:, 0].double()
        take = still_rejecting & ratio
        chosen = torch.where(take, torch.full_like(chosen, b), chosen)
        rest = (residual - drawn_from).clamp_min(0)
        total = rest.sum(-1, keepdim=True)
        rest = torch.where(total > 0, rest / total.clamp_min(torch.finfo(rest.dtype).tiny), residual)
        residual = torch.where((still_rejecting & ~take)[:, None], rest, residual)
    branch = chosen.clamp_min(0)
    steps = torch.arange(gamma, device=target_probs.device)
    fed = 1 + branch[:, None] * gamma + steps  # [B, gamma]: the branch's nodes
    rows = lambda probs, at: probs.gather(1, at[..., None].expand(-1, -1, vocabulary))
    more, chain_token = verify_sampling(tree.tokens.gather(1, fed[:, 1:] - 1), rows(target_probs, fed),
                                        rows(proposal_probs, fed[:, 1:] - 1), uniforms[:, branches:])
    none = chosen < 0
    accepted = torch.where(none, torch.zeros_like(more), 1 + more)
    next_token = torch.where(none, sample_tokens(residual, uniforms[:, -1]), chain_token)
    path = torch.where(steps + 1 <= accepted[:, None], fed, torch.zeros_like(fed))
    return TreeOutcome(accepted, next_token, torch.cat([fed.new_zeros(fed.shape[0], 1), path], 1))


# What a verified block keeps


@dataclass(frozen=True)
class BlockOutcome:
    """`tokens`: appended to the output; `accepted`: the accepted proposals among them (the
    block's contribution to tau); `stop`: generation ended (EOS or budget); `history`: how many
    of the block's positions the history learns from (0 after the last block)."""

    tokens: list[int]
    accepted: int
    stop: bool
    history: int


def settle_block(
    accepted_proposals: Sequence[int],
    next_token: int | None,
    *,
    gamma: int,
    produced: int,
    max_new_tokens: int,
    eos: set[int] | frozenset[int],
) -> BlockOutcome:
    """Cut the block at the first EOS and at the token budget.

    `accepted_proposals` are the proposals the target accepted, `next_token` the target's own
    token after them (None when replay has run out of traced output), `produced` the tokens
    output before this block. History positions are the accepted proposals plus the first
    rejected one, i.e. `min(accepted + 1, gamma)`: exactly the positions where the draft's and
    the target's distributions were both computed from the true prefix (not the bonus position).
    """
    block = list(accepted_proposals) + ([] if next_token is None else [next_token])
    kept = block[: max_new_tokens - produced]
    stop = len(kept) == max_new_tokens - produced
    for i, token in enumerate(kept):
        if token in eos:
            kept, stop = kept[: i + 1], True
            break
    accepted = min(len(accepted_proposals), len(kept))
    return BlockOutcome(kept, accepted, stop, 0 if stop else min(len(accepted_proposals) + 1, gamma))


def recorded_weights(weights: torch.Tensor | Sequence[float]) -> list[float]:
    """The block's ensemble weights as stored in a record."""
    return [round(float(w), WEIGHT_DECIMALS) for w in weights]
