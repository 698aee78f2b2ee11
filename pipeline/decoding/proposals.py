"""What a block hands between the draft's side, the target's side and the loop, per request:
the tokens the draft has not seen (`Pending`), a proposal of each kind with the rules that
depend on what it proposes (`Proposal`: lossless acceptance of a sampled block, each method's
distributions along the accepted path for the TABED history), and what the target kept
(`Verified`), which a proposer learns from."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.acceptance import TreeOutcome, verify_branches_sampling, verify_sampling
from pipeline.decoding.trees import Tree


@dataclass
class Pending:
    """The tokens each request's rows have not seen yet, right-aligned: `tokens` `[B, width]` on
    the device, `counts` how many of each request's are real (the rest are fillers)."""

    tokens: torch.Tensor
    counts: list[int]

    @staticmethod
    def after(verified: Verified, gammas: list[int]) -> Pending:
        """What the draft has not seen after a block whose proposals it fed all but the last: the
        target's token, after the last proposal when a request accepted all `gammas[b]`."""
        full = [run and a == g for a, g, run in zip(verified.accepted, gammas, verified.running)]
        if not any(full):
            return Pending(verified.next_token[:, None], [1] * len(full))
        last = verified.path_tokens.gather(1, (verified.accepted_device - 1).clamp_min(0)[:, None])
        return Pending(torch.cat([last, verified.next_token[:, None]], 1), [1 + f for f in full])

    def per_row(self, rows_per_request: int) -> tuple[torch.Tensor, list[int]]:
        """The tokens and real counts of every row, request-major."""
        counts = [c for c in self.counts for _ in range(rows_per_request)]
        return self.tokens.repeat_interleave(rows_per_request, 0), counts


@dataclass
class Verified:
    """What the target kept of a block, for the proposer: per request the `accepted` proposals
    (host) and the same on the device, the target's `next_token` (`[B]`), the accepted path's
    fed positions `path` (`[B, gamma + 1]`, root first; None for a chain) and tokens
    `path_tokens` (`[B, gamma]`, filler past the accepted), whether each request goes on
    (`running`, host), and where the proposer asked for them (`wants_target_hidden`), the
    hidden states the target's LM head read at the root and along the path `[B, gamma + 1, H]`."""

    accepted: list[int]
    accepted_device: torch.Tensor
    next_token: torch.Tensor
    path: torch.Tensor | None
    path_tokens: torch.Tensor
    running: list[bool]
    hidden: torch.Tensor | None = None


@dataclass
class Proposal:
    """A block's proposals on the device: `tokens` `[B, N]` (a chain's in order, or a tree's
    nodes), `tree` (None for a chain) and `draws` `[B, N, V]` (the distribution each token was
    drawn from: sampling's q); per request its block's depth `gammas` and a bandit's shape `arms`
    (None: no bandit)."""

    tokens: torch.Tensor
    tree: Tree | None
    draws: torch.Tensor | None
    gammas: list[int]
    arms: list[int] | None

    def accept_sampled(self, target_probs: torch.Tensor, uniforms: torch.Tensor) -> TreeOutcome:
        """(accepted, the target's next token, the accepted path's fed positions or None for a
        chain) of a sampled block, keeping the target's distribution: speculative sampling."""
        accepted, token = verify_sampling(self.tokens, target_probs, self.draws, uniforms)
        return TreeOutcome(accepted, token, None)

    def history(self, path: torch.Tensor | None, accepted: torch.Tensor) -> torch.Tensor:
        """Each method's distributions `[B, gamma, m, V]` at the root and along each request's
        accepted path (its first positions are what the history learns from)."""
        raise NotImplementedError


@dataclass
class ChainProposal(Proposal):
    """`methods` `[B, gamma, m, V]`: each method's distributions at the root and the proposals
    (None when the weights learn nothing)."""

    methods: torch.Tensor | None

    def history(self, path: torch.Tensor | None, accepted: torch.Tensor) -> torch.Tensor:
        return self.methods


@dataclass
class CandidateProposal(Proposal):
    """`methods` `[B, branches, gamma, m, V]` per branch (None when the weights learn nothing)."""

    methods: torch.Tensor | None

    def accept_sampled(self, target_probs: torch.Tensor, uniforms: torch.Tensor) -> TreeOutcome:
        """SpecInfer's multi-candidate rule over the branches (`acceptance.verify_branches_sampling`)."""
        branches = self.draws.shape[1] // self.tree.gamma
        return verify_branches_sampling(self.tree, branches, target_probs, self.draws, uniforms)

    def branch(self, path: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """`[B]`: the branch whose rows drafted each accepted path: the first holding its deepest
        node; the ensembled branch when nothing was accepted (every branch shares the root)."""
        return (path.gather(1, accepted[:, None])[:, 0] - 1).clamp_min(0) // self.tree.gamma

    def history(self, path: torch.Tensor | None, accepted: torch.Tensor) -> torch.Tensor:
        index = self.branch(path, accepted).view(-1, *[1] * (self.methods.dim() - 1))
        return self.methods.gather(1, index.expand(-1, 1, *self.methods.shape[2:]))[:, 0]
