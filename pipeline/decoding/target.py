"""The target's side of a block: one forward over each request's pending token and proposals (a
chain, or a token tree with each request's tree mask), the acceptance rule, and the roll back of
the target's rows to each accepted path. Everything stays on the device; the decoding loop
reads the outcome in its one transfer per block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.acceptance import probabilities, verify_tree_greedy
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.proposals import Proposal
from pipeline.decoding.rows_protocol import Rows


@dataclass
class Checked:
    """A verified block on the device, per request: `accepted` proposals and the target's
    `next_token` (`[B]`), the accepted path's tokens `path_tokens` (`[B, gamma]`, filler past
    `accepted`), its fed positions `path` (`[B, gamma + 1]`, root first; None for a chain), the
    target's distributions at the root and along the path `path_probs` (`[B, gamma, V]`, the TABED
    history's p; None when nothing needs them), the hidden states its LM head read there
    (`[B, gamma + 1, H]`, only when asked) and, when asked, every fed token with the target's top
    tokens after it (`observed`: `[B, N + 1]` and `[B, N + 1, k]`, what Token Recycling learns)."""

    accepted: torch.Tensor
    next_token: torch.Tensor
    path_tokens: torch.Tensor
    path: torch.Tensor | None
    path_probs: torch.Tensor | None
    hidden: torch.Tensor | None
    observed: tuple[torch.Tensor, torch.Tensor] | None = None


def check(rows: Rows, pending: torch.Tensor, proposal: Proposal, config: DecodeConfig,
          uniforms: torch.Tensor | None, keep_probs: bool, hidden: tuple[int, ...] = (),
          top_k: int = 0) -> Checked:
    """Score each request's `pending` token (`[B]`) and proposals in ONE target forward and
    accept: greedy follows the target's argmax, sampling keeps the target's distribution by the
    rule of the proposal's kind (`accept_sampled`). `uniforms`: sampling's draws for acceptance
    `[B, checks]`; `keep_probs`: return p; `hidden`: return those hidden states (`LVLM.logits`);
    `top_k`: return the target's top tokens at every fed position."""
    tree = proposal.tree
    fed = torch.cat([pending[:, None], proposal.tokens], 1)
    keep = fed.shape[1]
    if tree is None:
        out = rows.feed(fed, keep=keep, hidden=hidden)
    else:
        rows.begin_tree()
        out = rows.feed_tree(fed, tree.fed_depths(), tree.ancestry(), keep=keep, hidden=hidden)
    logits, states = out if hidden else (out, None)
    observed = (fed, logits.topk(top_k, -1).indices) if top_k else None
    p = probabilities(logits, config.temperature) if keep_probs or not config.greedy else None
    if not config.greedy:
        outcome = proposal.accept_sampled(p, uniforms)
        accepted, next_token, path = outcome.accepted, outcome.next_token, outcome.path
    elif tree is None:
        (accepted, next_token), path = proposal.accept_greedy(logits), None
    else:
        outcome = verify_tree_greedy(tree, logits)
        accepted, next_token, path = outcome.accepted, outcome.next_token, outcome.path
    if path is None:
        on_path = lambda values: values[:, :keep]
        return Checked(accepted, next_token, proposal.tokens, None, None if p is None else p[:, :-1],
                       None if states is None else on_path(states), observed)
    along = lambda values, at: values.gather(1, at[..., None].expand(-1, -1, values.shape[-1]))
    path_probs = None if p is None else along(p, path[:, :-1])
    return Checked(accepted, next_token, fed.gather(1, path[:, 1:]), path, path_probs,
                   None if states is None else along(states, path), observed)


def keep_accepted(rows: Rows, checked: Checked, accepted: list[int], running: list[bool]) -> None:
    """Each running request's target row keeps its pending token and accepted proposals: a
    tree's accepted path, moved behind what came before; a stopped request keeps nothing."""
    rows.settle([1 + a if run else 0 for a, run in zip(accepted, running)], checked.path)
