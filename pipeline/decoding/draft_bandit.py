"""The tree-shape bandit (the Mamba drafters paper's test-time tree search): one static-shape
tree per block and request, the shape chosen by UCB1 from the request's own blocks before. Its
reward uses costs fixed by the configuration, so trace replay drives the same bandit with the
same counts (`BanditRule` serves both)."""
from __future__ import annotations

import math

import torch

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft_trees import RankedProposal, ShapeTreeProposer, shape_accepted
from pipeline.decoding.proposals import Pending, Verified
from pipeline.decoding.rows_protocol import Rows


class UCB1:
    """UCB1 over `arms`: each unplayed arm first, then the highest mean reward plus
    c sqrt(2 ln t / n) (ties to the earlier arm)."""

    def __init__(self, arms: int, c: float) -> None:
        self.c, self.plays, self.means, self.t = c, [0] * arms, [0.0] * arms, 0

    def choose(self) -> int:
        if 0 in self.plays:
            return self.plays.index(0)
        bonus = lambda n: self.c * math.sqrt(2 * math.log(self.t) / n)
        scores = [mean + bonus(n) for mean, n in zip(self.means, self.plays)]
        return scores.index(max(scores))

    def update(self, arm: int, reward: float) -> None:
        self.t += 1
        self.plays[arm] += 1
        self.means[arm] += (reward - self.means[arm]) / self.plays[arm]


class BanditRule:
    """One request's bandit, shared by live decoding (`BanditTreeProposer`) and replay: which
    shape the next block uses, and learning from what the last one accepted."""

    def __init__(self, config: DecodeConfig) -> None:
        spec = config.verify
        self.shapes, self.costs, self.lam = spec.shapes, spec.arm_costs(), spec.lam
        self.bandit = UCB1(len(self.shapes), spec.c)
        self.arm = self.bandit.choose()

    @property
    def gamma(self) -> int:
        return len(self.shapes[self.arm])

    def accepted(self, q: torch.Tensor, y: list[int], t: int, gamma: int, mixing: torch.Tensor) -> int:
        return shape_accepted(q, y, t, self.shapes[self.arm], mixing)

    def observe(self, accepted: int) -> None:
        """The paper's reward, tokens produced per unit of cost: -(1 + lam cost) / (accepted + 1)."""
        self.bandit.update(self.arm, -(1 + self.lam * self.costs[self.arm]) / (accepted + 1))
        self.arm = self.bandit.choose()


class BanditTreeProposer(ShapeTreeProposer):
    """A shape tree per block and request, the shape chosen by the request's own `BanditRule`
    from its blocks before."""

    def start(self, rows: Rows) -> None:
        super().start(rows)
        self.rules = [BanditRule(self.config) for _ in range(rows.rows // rows.per_request)]

    def shapes(self, requests: int) -> list[tuple[int, ...]]:
        return [rule.shapes[rule.arm] for rule in self.rules]

    def arms(self) -> list[int] | None:
        return [rule.arm for rule in self.rules]

    def learn(self, proposal: RankedProposal, verified: Verified) -> Pending:
        pending = super().learn(proposal, verified)
        for rule, accepted, running in zip(self.rules, verified.accepted, verified.running):
            if running:
                rule.observe(accepted)
        return pending

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> BanditRule:
        return BanditRule(config)
