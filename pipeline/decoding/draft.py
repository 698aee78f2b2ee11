"""The draft's side of a block: a proposer turns the draft rows into proposals — a chain or a
token tree — and, once the target has checked them, rolls its rows back to the accepted path.

A proposer is to the decoding loop what a candidate generator is to transformers' assisted
generation: `propose` (the block's proposals, on the device), `history` (each drafting
method's distributions along the accepted path, for the TABED weights) and `keep` (roll back,
return the tokens the rows have not seen yet). It also owns its kind's two rules that depend
on what it proposes: `accept_sampled` (lossless acceptance of a sampled block) and
`replay_accepted` (greedy acceptance along the target's output, for trace replay). Each is
registered under the verify kind it drafts (`pipeline.decoding.verify_kinds`): `PROPOSERS`
(`pipeline.decoding.draft_kinds` finds the one for a spec). What a proposer needs back from its
own proposal is a small dataclass of its kind (`ChainProposal`, `CandidateProposal`, ...).
Every proposer mixes the methods with the block's weights w* exactly as the chain does; they
differ in what they propose:
- `ChainProposer`: gamma tokens, each the mixture's choice, fed to every method's row.
- `CandidateProposer`: the ensembled chain and each method's own chain, each in its own group
  of method rows (B branches x m rows in one batch), so every method's distribution is known
  at every node and the TABED history is exactly a chain's.
- `DynamicTreeProposer` (`pipeline.decoding.draft_dynamic`), `ShapeTreeProposer` and
  `BanditTreeProposer` (`pipeline.decoding.draft_shapes`): trees whose children are ranked.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.acceptance import (
    probabilities, sample_token, verify_branches_sampling, verify_sampling,
)
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.rows import Rows
from pipeline.decoding.trees import Tree, candidate_tree
from pipeline.decoding.verify_kinds import candidate_branches
from pipeline.drafting.scoring import mix

PROPOSERS: dict[str, type["ChainProposer"]] = {}  # verify kind -> the proposer that drafts it


@dataclass
class Proposal:
    """A block's proposals on the device: `tokens` `[N]` (a chain's in order, or a tree's
    nodes), `tree` (None for a chain) and `draws` `[N, V]` (the distribution each token was
    drawn from: sampling's q). Each kind's subclass adds what its proposer needs back for
    `history` and `keep`."""

    tokens: torch.Tensor
    tree: Tree | None
    draws: torch.Tensor | None


@dataclass
class ChainProposal(Proposal):
    """`methods` `[gamma, m, V]`: each method's distributions at the root and the proposals
    (None when the weights learn nothing)."""

    methods: torch.Tensor | None


@dataclass
class CandidateProposal(Proposal):
    """`methods` `[B, gamma, m, V]` per branch (None when the weights learn nothing); `start`:
    continuation tokens the rows held before the block (where branches are copied from)."""

    methods: torch.Tensor | None
    start: int


class StaticRule:
    """Greedy trace replay of a proposer whose block shape never changes: `accepted(q, y, t,
    gamma, mixing)` is its `replay_accepted`; `observe` learns nothing; `arm` is None (a
    bandit's rule says which shape each block used)."""

    arm = None

    def __init__(self, gamma: int, accepted) -> None:
        self.gamma, self._accepted = gamma, accepted

    def accepted(self, q: torch.Tensor, y: list[int], t: int, gamma: int, mixing: torch.Tensor) -> int:
        return self._accepted(q, y, t, gamma, mixing)

    def observe(self, accepted: int) -> None:
        """What the block accepted (a bandit learns from it)."""


class ChainProposer:
    """`gamma` proposals from the mixture of all rows (one row per drafting method). A subclass
    registers for the verify kind it drafts with `kind=`."""

    def __init_subclass__(cls, kind: str = "", **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if kind:
            PROPOSERS[kind] = cls

    def __init__(self, rows: Rows, config: DecodeConfig) -> None:
        self.rows, self.config = rows, config
        self.gamma = config.gamma  # this block's draft steps (a bandit's changes per block)
        # tokens the sample may still produce, set by the decoder before each block: the draft
        # runs at most that many forwards (a block keeps no more tokens); deeper proposals are
        # the last real one repeated, so shapes, outputs and accepted counts stay as they were
        self.budget = config.max_new_tokens
        # sampling's uniforms per block: one per proposal, then the target's acceptance tests
        # and its emitted token (`pipeline.decoding.target.check`)
        self.draws_per_block, self.checks_per_block = config.gamma, config.gamma + 1

    def propose(self, pending: torch.Tensor, weights: torch.Tensor, uniforms: torch.Tensor | None,
                keep_methods: bool) -> Proposal:
        """`pending`: the shared tokens the rows have not seen (1, or 2 after a fully accepted
        chain); `weights` in the distributions' dtype (`mixing_weights`)."""
        config = self.config
        logits = self.rows.feed(pending)[:, -1]
        proposals, method_probs, mixed_probs = [], [], []
        for i in range(config.gamma):
            q = probabilities(logits, config.temperature)  # [m, V]
            mixed = mix(q, weights)
            if config.greedy:
                token = mixed.argmax(-1, keepdim=True)
            else:
                token = sample_token(mixed, uniforms[i]).view(1)
            proposals.append(token)
            method_probs.append(q)
            mixed_probs.append(mixed)
            if i < min(config.gamma, self.budget) - 1:
                logits = self.rows.feed(token)[:, -1]
        methods = torch.stack(method_probs) if keep_methods else None
        return ChainProposal(torch.cat(proposals), None, torch.stack(mixed_probs), methods)

    def history(self, proposal: ChainProposal, path: torch.Tensor, accepted: int,
                positions: int) -> torch.Tensor:
        """Each method's distributions `[positions, m, V]` at the root and the accepted proposals."""
        return proposal.methods[:positions]

    def keep(self, proposal: Proposal, path: torch.Tensor, accepted: int, before: int,
             block: torch.Tensor) -> torch.Tensor:
        """Keep the accepted proposals the rows fed (never the last one); `block`: the accepted
        proposals and the target's token, on the device. Returns the next pending tokens."""
        kept = min(accepted, self.gamma - 1)
        self.rows.keep_shared(before + kept)
        return block[kept : accepted + 1]

    def accept_sampled(self, proposal: Proposal, target_probs: torch.Tensor,
                       uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(accepted, the target's next token, the accepted path's fed positions or None for a
        chain) of a sampled block, keeping the target's distribution: speculative sampling."""
        accepted, token = verify_sampling(proposal.tokens, target_probs, proposal.draws, uniforms)
        return accepted, token, None

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> StaticRule:
        """Greedy trace replay of this kind for one sample (`pipeline.decoding.replay`)."""
        return StaticRule(config.gamma, cls.replay_accepted)

    @staticmethod
    def replay_accepted(q: torch.Tensor, y: list[int], t: int, gamma: int, mixing: torch.Tensor) -> int:
        """Greedy trace replay: how many proposals of the block starting at position t the
        target accepts. The proposal at t+i is the mixture's argmax there, reached only while
        the earlier ones matched y, so from the true prefix; one position at a time, as live
        mixes them (same shapes, same rounding). `q` `[n, m, V]`: each method along y."""
        accepted = 0
        while accepted < gamma and t + accepted < len(y):
            if int(mix(q[t + accepted], mixing).argmax()) != y[t + accepted]:
                break
            accepted += 1
        return accepted


PROPOSERS["chain"] = ChainProposer


class CandidateProposer(ChainProposer, kind="candidates"):
    """The ensembled chain (branch 0) and each drafting method's own greedy or sampled chain
    (branch 1 + i), `gamma` deep: B groups of the m method rows, group b fed branch b's tokens.
    Greedy chains are merged into a prefix tree; sampled ones stay apart below the root."""

    def __init__(self, rows: Rows, config: DecodeConfig) -> None:
        super().__init__(rows, config)
        self.methods = len(config.methods)
        self.branches = candidate_branches(self.methods)
        self.draws_per_block = self.branches * config.gamma
        self.checks_per_block = self.branches + config.gamma

    def propose(self, pending: torch.Tensor, weights: torch.Tensor, uniforms: torch.Tensor | None,
                keep_methods: bool) -> Proposal:
        config, branches, m = self.config, self.branches, self.methods
        start = self.rows.fed
        logits = self.rows.feed(pending)[:, -1]
        own = torch.arange(m, device=logits.device)
        tokens, method_probs, draws = [], [], []
        for i in range(config.gamma):
            q = probabilities(logits, config.temperature).view(branches, m, -1)
            ensemble = mix(q[0], weights)[None]
            dists = torch.cat([ensemble, q[1 + own, own]]) if branches > 1 else ensemble  # [B, V]
            if config.greedy:
                token = dists.argmax(-1)
            else:
                mine = uniforms[i * branches : (i + 1) * branches]
                token = torch.stack([sample_token(dists[b], mine[b]) for b in range(branches)])
            tokens.append(token)
            method_probs.append(q)
            draws.append(dists)
            if i < min(config.gamma, self.budget) - 1:
                logits = self.rows.feed(token.repeat_interleave(m)[:, None])[:, -1]
        tree = candidate_tree(torch.stack(tokens, 1), merge=config.greedy)
        methods = torch.stack(method_probs, 1) if keep_methods else None  # [B, gamma, m, V]
        return CandidateProposal(tree.tokens, tree, torch.stack(draws, 1).flatten(0, 1), methods, start)

    def _branch(self, path: torch.Tensor, accepted: int) -> torch.Tensor:
        """The branch (0-d) whose rows drafted the accepted path: the first holding its deepest
        node; the ensembled branch when nothing was accepted (every branch shares the root)."""
        return (path[accepted] - 1).clamp_min(0) // self.gamma

    def history(self, proposal: CandidateProposal, path: torch.Tensor, accepted: int,
                positions: int) -> torch.Tensor:
        methods = proposal.methods.index_select(0, self._branch(path, accepted).view(1))[0]
        return methods[:positions]

    def keep(self, proposal: CandidateProposal, path: torch.Tensor, accepted: int, before: int,
             block: torch.Tensor) -> torch.Tensor:
        if self.branches > 1:
            self.rows.copy_rows(self.branches, self._branch(path, accepted), proposal.start)
        return super().keep(proposal, path, accepted, before, block)

    def accept_sampled(self, proposal: Proposal, target_probs: torch.Tensor,
                       uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """SpecInfer's multi-candidate rule over the branches (`acceptance.verify_branches_sampling`)."""
        outcome = verify_branches_sampling(proposal.tree, self.branches, target_probs, proposal.draws,
                                           uniforms)
        return outcome.accepted, outcome.next_token, outcome.path

    @staticmethod
    def replay_accepted(q: torch.Tensor, y: list[int], t: int, gamma: int, mixing: torch.Tensor) -> int:
        """The tree also holds each method's own chain: the path goes on while some branch still
        on it (its chain equal to y so far) proposes y's next token (0: the ensembled chain;
        1 + i: method i's own), each a distribution at t+i along y."""
        alive = list(range(1 + q.shape[1])) if q.shape[1] > 1 else [0]
        accepted = 0
        while accepted < gamma and t + accepted < len(y):
            here = q[t + accepted]
            choice = lambda b: int((mix(here, mixing) if b == 0 else here[b - 1]).argmax())
            alive = [b for b in alive if choice(b) == y[t + accepted]]
            if not alive:
                break
            accepted += 1
        return accepted
