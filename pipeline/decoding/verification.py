"""The target's side of a block: one forward over the pending token and the proposals (a
chain, or a token tree with its tree mask), the acceptance rule, and the roll back of the
target's cache to the accepted path. Everything stays on the device; the decoding loop reads
the outcome in its one transfer per block.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.proposers import Proposal
from pipeline.decoding.rows import DynamicCacheRows
from pipeline.decoding.trees import verify_branches_sampling, verify_tree_greedy
from pipeline.decoding.verify import probabilities, verify_greedy, verify_sampling
from pipeline.decoding.verify_spec import candidate_branches


@dataclass
class Checked:
    """A verified block on the device: `accepted` proposals and the target's `next_token`
    (0-d), the accepted path's tokens `path_tokens` `[depth]` (entries past `accepted` are
    filler), its fed positions `path` (`[depth + 1]`, root first; None for a chain) and the
    target's distributions at the root and along the path `path_probs` `[depth, V]` (the TABED
    history's p; None when nothing needs them)."""

    accepted: torch.Tensor
    next_token: torch.Tensor
    path_tokens: torch.Tensor
    path: torch.Tensor | None
    path_probs: torch.Tensor | None


def check(rows: DynamicCacheRows, pending: torch.Tensor, proposal: Proposal, config: DecodeConfig,
          uniforms: torch.Tensor | None, keep_probs: bool) -> Checked:
    """Score `pending` and the proposals in ONE target forward and accept: greedy follows the
    target's argmax, sampling is lossless speculative sampling (a chain's, or over a candidate
    tree's branches). `uniforms`: sampling's draws for acceptance; `keep_probs`: return p."""
    if proposal.tree is None:
        logits = rows.feed(torch.cat([pending, proposal.tokens]), keep=config.gamma + 1)[0]
        p = probabilities(logits, config.temperature) if keep_probs or not config.greedy else None
        if config.greedy:
            accepted, next_token = verify_greedy(proposal.tokens, logits)
        else:
            accepted, next_token = verify_sampling(proposal.tokens, p, proposal.draws, uniforms)
        return Checked(accepted, next_token, proposal.tokens, None, p)
    tree = proposal.tree
    fed = torch.cat([pending, tree.tokens])
    rows.begin_tree()
    logits = rows.feed_tree(fed, tree.fed_depths(), tree.ancestry(), keep=tree.size + 1)[0]
    p = probabilities(logits, config.temperature) if keep_probs or not config.greedy else None
    if config.greedy:
        outcome = verify_tree_greedy(tree, logits)
    else:
        branches = candidate_branches(len(config.methods))
        outcome = verify_branches_sampling(tree, branches, p, proposal.draws, uniforms)
    path_probs = None if p is None else p[outcome.path[:-1]]
    return Checked(outcome.accepted, outcome.next_token, fed[outcome.path[1:]], outcome.path, path_probs)


def keep_accepted(rows: DynamicCacheRows, checked: Checked, accepted: int, before: int) -> None:
    """Keep the target's cache up to the accepted path: a tree's path moves up behind the root
    first. `before`: the shared tokens fed before the block; `accepted`: read from the block's
    transfer."""
    if checked.path is not None and accepted:
        rows.keep_path(rows.tree_start + checked.path[1 : accepted + 1], rows.tree_start + 1)
    rows.keep_shared(before + accepted)
