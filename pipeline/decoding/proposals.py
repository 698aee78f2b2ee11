"""What a block hands between the draft's side, the target's side and the loop, per request:
the tokens the draft has not seen (`Pending`), a proposal of each kind with the rules that
depend on what it proposes (`Proposal`: lossless acceptance of a sampled block, each method's
distributions along the accepted path for the TABED history), and what the target kept
(`Verified`), which a proposer learns from."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pipeline.decoding.acceptance import TreeOutcome, verify_branches_sampling, verify_greedy, verify_sampling
from pipeline.decoding.trees import Tree

if TYPE_CHECKING:
    from pipeline.decoding.rows_protocol import Rows


@dataclass
class Pending:
    """The tokens each request's rows have not seen yet, right-aligned: `tokens` `[B, width]` on
    the device, `counts` how many of each request's are real (the rest are fillers), and for
    rows that read the target (a head's) `features` `[B, width, F]`: the target's states before
    each token."""

    tokens: torch.Tensor
    counts: list[int]
    features: torch.Tensor | None = None

    @staticmethod
    def after(verified: Verified, refeed: list[bool], rereads: bool = False) -> Pending:
        """What the draft has not seen after a block: the target's token, after the last accepted
        proposal where `refeed` says the rows did not keep it (a chain never feeds its last
        proposal). `rereads`: the rows kept only what they read with the target's states
        (`Rows.rereads_kept`), so every accepted proposal comes again, with those states (`reread`)."""
        if rereads:
            return Pending.reread(verified)
        if not any(refeed):
            return Pending(verified.next_token[:, None], [1] * len(refeed))
        last = verified.path_tokens.gather(1, (verified.accepted_device - 1).clamp_min(0)[:, None])
        return Pending(torch.cat([last, verified.next_token[:, None]], 1), [1 + r for r in refeed])

    @staticmethod
    def reread(verified: Verified) -> Pending:
        """Each request's accepted proposals and the target's token after them, each beside the
        target's states at the position before it (the root's, then the path's)."""
        if verified.hidden is None:
            raise ValueError("rows that read the target need its states: the block was verified without them")
        counts = [a + 1 for a in verified.accepted]
        width, gamma = max(counts), verified.path_tokens.shape[1]
        device = verified.path_tokens.device
        # column j of request b holds its element a_b + 1 - width + j (negative: a filler)
        element = verified.accepted_device[:, None] + 1 - width + torch.arange(width, device=device)[None]
        at = element.clamp_min(0)
        proposals = verified.path_tokens.gather(1, at.clamp_max(gamma - 1))
        tokens = torch.where(at == verified.accepted_device[:, None], verified.next_token[:, None], proposals)
        states = verified.hidden.gather(1, at[..., None].expand(-1, -1, verified.hidden.shape[-1]))
        return Pending(tokens, counts, states)

    def per_row(self, rows_per_request: int) -> tuple[torch.Tensor, list[int]]:
        """The tokens and real counts of every row, request-major."""
        counts = [c for c in self.counts for _ in range(rows_per_request)]
        return self.tokens.repeat_interleave(rows_per_request, 0), counts

    def feed_into(self, rows: Rows, rows_per_request: int) -> torch.Tensor:
        """Feed every row its request's pending tokens (and features, to rows that read them):
        the block's first feed. Logits after the last `[rows, 1, V]`."""
        tokens, counts = self.per_row(rows_per_request)
        features = None if self.features is None else self.features.repeat_interleave(rows_per_request, 0)
        return rows.feed(tokens, valid=counts, features=features)


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

    def accept_greedy(self, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(accepted, the target's next token) of a greedy chain block."""
        return verify_greedy(self.tokens, target_logits)

    def history(self, path: torch.Tensor | None, accepted: torch.Tensor) -> torch.Tensor:
        """Each method's distributions `[B, gamma, m, V]` at the root and along each request's
        accepted path (its first positions are what the history learns from)."""
        raise NotImplementedError


@dataclass
class ChainProposal(Proposal):
    """`methods` `[B, gamma, m, V]`: each method's distributions at the root and the proposals
    (None when the weights learn nothing); `depths` `[B]`: the proposals each request really
    made, where a member may abstain (a lookup without a match; None: all of them): the block
    holds as many as the deepest request's, its `gammas` stay the configuration's."""

    methods: torch.Tensor | None
    depths: torch.Tensor | None = None

    def accept_sampled(self, target_probs: torch.Tensor, uniforms: torch.Tensor) -> TreeOutcome:
        """A block cut short of gamma (every request abstained past it) still draws its token with
        the block's last uniform, so a request draws what it draws alone, whatever batch it is in."""
        g = self.tokens.shape[1]
        uniforms = torch.cat([uniforms[:, :g], uniforms[:, -1:]], 1)
        accepted, token = verify_sampling(self.tokens, target_probs, self.draws, uniforms, self.depths)
        return TreeOutcome(accepted, token, None)

    def accept_greedy(self, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return verify_greedy(self.tokens, target_logits, self.depths)

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
