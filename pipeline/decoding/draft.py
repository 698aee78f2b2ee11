"""The draft's side of a block: a proposer turns the draft's rows into each request's proposals
— a chain or a token tree — and, once the target has checked them, rolls its rows back to the
accepted path.

A proposer is to the decoding loop what a candidate generator is to transformers' assisted
generation, batch-first like vLLM's proposers: every tensor has a leading request dimension B,
and a request's rows are its drafting methods (times a candidate tree's branches). `Proposer`
declares the contract, three methods:
- `start(rows)`: the draft's prefilled rows, once per decode;
- `propose(pending, weights, budgets, uniforms)`: the block's proposals, on the device;
- `learn(proposal, verified)`: roll the rows back to what the target kept (and learn whatever
  the proposer learns from a block); returns the tokens the rows have not seen yet.
What a proposal needs to answer for the rest of the block lives on its `Proposal`
(`pipeline.decoding.proposals`): how a sampled block is accepted losslessly (`accept_sampled`)
and each drafting method's distributions along the accepted path, for the TABED history
(`history`). Greedy trace replay of a kind is the
proposer's `replay_rule`. A verify kind names its proposer (`VerifySpec.proposer`); every
proposer mixes the methods with each request's weights w* exactly as the chain does:
- `ChainProposer`: gamma tokens, each the mixture's choice, fed to every method's row;
- `CandidateProposer`: the ensembled chain and each method's own chain, each in its own group
  of method rows (branches x m rows per request), so every method's distribution is known at
  every node and the TABED history is exactly a chain's;
- ranked trees (`pipeline.decoding.draft_trees`): dynamic, static-shape and bandit trees.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from pipeline.decoding.acceptance import probabilities, sample_tokens
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.proposals import CandidateProposal, ChainProposal, Pending, Proposal, Verified
from pipeline.decoding.rows_protocol import Rows
from pipeline.decoding.trees import candidate_tree
from pipeline.decoding.verify_kinds import VerifySpec
from pipeline.drafting.scoring import mix


class Proposer(ABC):
    """What the decoding loop asks of a proposer, for B requests at once. Set by the proposer
    itself (never by the loop): `draws_per_block` and `checks_per_block`, the uniforms a sampled
    block takes per request for drafting and for the target's acceptance test;
    `wants_target_hidden`: the loop hands `learn` the target's hidden states of the kept tokens
    (an EAGLE-style head reads them); nobody pays for them when no proposer asks."""

    wants_target_hidden: ClassVar[bool] = False

    def __init__(self, config: DecodeConfig) -> None:
        self.config = config
        self.methods = len(config.methods)
        # each method's distributions are kept for the history only when the weights learn
        self.keep_methods = config.policy.dynamic and self.methods > 1
        self.draws_per_block, self.checks_per_block = config.gamma, config.gamma + 1

    @abstractmethod
    def start(self, rows: Rows) -> None:
        """The draft's rows, prefilled with every request's prompts but their last token."""

    @abstractmethod
    def propose(self, pending: Pending, weights: torch.Tensor, budgets: list[int],
                uniforms: torch.Tensor | None) -> Proposal:
        """`pending`: what the rows have not seen; `weights` `[B, m]` in the distributions' dtype
        (`mixing_weights`); `budgets`: the tokens each request may still produce (0: it has
        stopped): the draft runs at most as many forwards as the largest (a block keeps no more),
        deeper proposals repeat the last real one; `uniforms` `[B, draws + checks]`: sampling's."""

    @abstractmethod
    def learn(self, proposal: Proposal, verified: Verified) -> Pending:
        """Keep what the target kept of each running request in the rows; the next pending tokens."""

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> StaticRule:
        """Greedy trace replay of this kind for one sample (`pipeline.decoding.replay`)."""
        raise ValueError(f"{cls.__name__} has no greedy replay rule: its kind runs live")

    def observe_target(self, fed: torch.Tensor, top: torch.Tensor) -> None:
        """The target's top tokens `[B, N + 1, k]` after every token it just read `[B, N + 1]`,
        for rows that learn from them (Token Recycling's: `LVLM.target_top_k`)."""
        observe = getattr(getattr(self, "rows", None), "observe_target", None)
        if observe is not None:
            observe(fed, top)

    def steps(self, budgets: list[int]) -> int:
        """Draft forwards this block needs: the deepest proposal any running request can keep."""
        return min(self.config.gamma, max(budgets))


def proposer_class(verify: VerifySpec) -> type[Proposer]:
    """The proposer a verify kind names (`module:Class`), imported on first use."""
    module, _, name = verify.proposer.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"verify kind {verify.kind!r} names proposer {verify.proposer!r}, which cannot be "
                         f"imported: {err}") from None
    if not (isinstance(found, type) and issubclass(found, Proposer)):
        raise ValueError(f"verify kind {verify.kind!r}: {verify.proposer!r} is not a Proposer subclass")
    return found


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


class ChainProposer(Proposer):
    """`gamma` proposals from the mixture of each request's rows (one row per drafting method);
    with `branches` > 1 (`CandidateProposer`), each method's own chain beside it."""

    def __init__(self, config: DecodeConfig) -> None:
        super().__init__(config)
        self.branches = config.verify.copies_per_method(self.methods)
        self.draws_per_block = self.branches * config.gamma
        self.checks_per_block = self.branches + config.gamma

    def start(self, rows: Rows) -> None:
        self.rows = rows
        self.fed_pending: list[int] = []  # each request's pending tokens fed this block

    def propose(self, pending: Pending, weights: torch.Tensor, budgets: list[int],
                uniforms: torch.Tensor | None) -> Proposal:
        config, branches, m = self.config, self.branches, self.methods
        requests = len(pending.counts)
        self.fed_pending = pending.counts
        logits = pending.feed_into(self.rows, branches * m)[:, -1]
        own = torch.arange(m, device=logits.device)
        tokens, method_probs, draws, steps = [], [], [], self.steps(budgets)
        depths = ended = None  # where the rows may abstain (a lookup's), each request's real proposals
        for i in range(config.gamma):
            if (abstains := getattr(self.rows, "abstains", None)) is not None and branches == 1:
                ended = abstains[:, -1].view(requests, m).all(1) | (False if ended is None else ended)
                depths = (~ended).long() + (0 if depths is None else depths)
            q = probabilities(logits, config.temperature).view(requests, branches, m, -1)
            ensemble = mix(q[:, 0], weights)[:, None]  # [B, 1, V]
            dists = torch.cat([ensemble, q[:, 1 + own, own]], 1) if branches > 1 else ensemble
            if config.greedy:
                token = dists.argmax(-1)  # [B, branches]
            else:
                mine = uniforms[:, i * branches : (i + 1) * branches]
                token = sample_tokens(dists.flatten(0, 1), mine.flatten()).view(requests, branches)
            tokens.append(token)
            method_probs.append(q)
            draws.append(dists)
            if i < steps - 1:
                logits = self.rows.feed(token.repeat_interleave(m, 1).view(-1, 1))[:, -1]
        chains, draws = torch.stack(tokens, 2), torch.stack(draws, 2)  # [B, branches, gamma(, V)]
        if depths is not None:  # rows that abstain (a lookup's): the target verifies what was proposed
            longest = int(depths.max())  # one read of what the host made (a lookup's rows are the host's)
            chains, draws = chains[..., :longest], draws[:, :, :longest]
        methods = torch.stack(method_probs, 2) if self.keep_methods else None  # [B, branches, gamma, m, V]
        gammas = [config.gamma] * requests
        if branches == 1:
            return ChainProposal(chains[:, 0], None, draws[:, 0], gammas, None,
                                 None if methods is None else methods[:, 0], depths)
        tree = candidate_tree(chains, merge=config.greedy)
        return CandidateProposal(tree.tokens, tree, draws.flatten(1, 2), gammas, None, methods)

    def learn(self, proposal: Proposal, verified: Verified) -> Pending:
        """Keep the pending tokens and the accepted proposals the rows fed (never the last)."""
        if self.branches > 1:
            self.rows.copy_rows(self.branches, proposal.branch(verified.path, verified.accepted_device), 0)
        per = self.branches * self.methods
        fed = proposal.gammas[0] - 1
        kept = [c + min(a, fed) if run else 0
                for c, a, run in zip(self.fed_pending, verified.accepted, verified.running)]
        self.rows.settle([k for k in kept for _ in range(per)])
        refeed = [run and a > fed for a, run in zip(verified.accepted, verified.running)]
        return Pending.after(verified, refeed, self.rows.rereads_kept)

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> StaticRule:
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


class CandidateProposer(ChainProposer):
    """The ensembled chain (branch 0) and each drafting method's own greedy or sampled chain
    (branch 1 + i), `gamma` deep: per request, branches groups of its m method rows, group b fed
    branch b's tokens. Greedy chains are merged into a prefix tree; sampled ones stay apart
    below the root."""

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
