"""The target's side of a block: one forward over the pending token and the proposals (a
chain, or a token tree with its tree mask), the acceptance rule, and the roll back of the
target's cache to the accepted path. Everything stays on the device; the decoding loop reads
the outcome in its one transfer per block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.acceptance import probabilities, verify_greedy, verify_tree_greedy
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import ChainProposer, Proposal
from pipeline.decoding.rows import Rows


@dataclass
class Checked:
    """A verified block on the device: `accepted` proposals and the target's `next_token`
    (0-d), the accepted path's tokens `path_tokens` `[gamma]` (entries past `accepted` are
    filler), its fed positions `path` (`[gamma + 1]`, root first; None for a chain) and the
    target's distributions at the root and along the path `path_probs` `[gamma, V]` (the TABED
    history's p; None when nothing needs them)."""

    accepted: torch.Tensor
    next_token: torch.Tensor
    path_tokens: torch.Tensor
    path: torch.Tensor | None
    path_probs: torch.Tensor | None


def check(rows: Rows, pending: torch.Tensor, proposal: Proposal, proposer: ChainProposer,
          config: DecodeConfig, uniforms: torch.Tensor | None, keep_probs: bool) -> Checked:
    """Score `pending` and the proposals in ONE target forward and accept: greedy follows the
    target's argmax, sampling keeps the target's distribution by the rule of the `proposer`
    that drafted them (`accept_sampled`). `uniforms`: sampling's draws for acceptance;
    `keep_probs`: return p."""
    tree = proposal.tree
    fed = torch.cat([pending, proposal.tokens])
    if tree is None:
        logits = rows.feed(fed, keep=config.gamma + 1)[0]
    else:
        rows.begin_tree()
        logits = rows.feed_tree(fed, tree.fed_depths(), tree.ancestry(), keep=tree.size + 1)[0]
    p = probabilities(logits, config.temperature) if keep_probs or not config.greedy else None
    if not config.greedy:
        accepted, next_token, path = proposer.accept_sampled(proposal, p, uniforms)
    elif tree is None:
        (accepted, next_token), path = verify_greedy(proposal.tokens, logits), None
    else:
        outcome = verify_tree_greedy(tree, logits)
        accepted, next_token, path = outcome.accepted, outcome.next_token, outcome.path
    if path is None:
        return Checked(accepted, next_token, proposal.tokens, None, p)
    return Checked(accepted, next_token, fed[path[1:]], path, None if p is None else p[path[:-1]])


def keep_accepted(rows: Rows, checked: Checked, accepted: int, before: int) -> None:
    """Keep the target's cache up to the accepted path: a tree's path moves up behind the root
    first. `before`: the shared tokens fed before the block; `accepted`: read from the block's
    transfer."""
    if checked.path is not None and accepted:
        rows.keep_path(rows.tree_start + checked.path[1 : accepted + 1], rows.tree_start + 1)
    rows.keep_shared(before + accepted)
