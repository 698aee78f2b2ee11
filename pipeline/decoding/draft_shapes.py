"""The draft's side of static-shape trees and of the bandit that picks one shape per block
(`pipeline.decoding.shape_kinds` holds their specs).

A shape `(N1, ..., Nd)` gives every node at depth k - 1 the top N_k tokens of the mixed draft
distribution at it. The draft reads levels 1 .. d - 1 to know those distributions: KV rows as a
token tree, one forward per level with a tree mask; a state-space draft's rows batch-expanded,
each node a group of method rows selected from its parent's. Children are ranked, never drawn:
greedy trace replay scores a shape from the ranks of the target's tokens along its output
(`shape_accepted`), and a sampled block is verified by SpecExec's rule. The bandit is UCB1 over
the shapes, one per request; its reward uses costs fixed by the configuration, so replay drives
the same bandit with the same counts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.decoding.acceptance import probabilities, verify_tree_sampled
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import ChainProposer, Proposal, StaticRule
from pipeline.decoding.rows import Rows
from pipeline.decoding.shape_kinds import shape_levels
from pipeline.decoding.state_rows import StateRows
from pipeline.decoding.trees import Tree
from pipeline.drafting.scoring import mix


@dataclass
class Layout:
    """A shape's tree in level order on the device: each node's fed parent and depth, where
    each level starts among the nodes, and for the draft's tree (levels 1 .. d - 1) who sees
    whom."""

    shape: tuple[int, ...]
    parents: torch.Tensor
    depths: torch.Tensor
    starts: list[int]  # level k (1-based) starts at node starts[k - 1]
    sees: torch.Tensor  # [fed nodes, fed nodes] over the draft's tree

    @staticmethod
    def of(shape: tuple[int, ...], device: torch.device) -> Layout:
        levels = shape_levels(shape)
        starts = [sum(levels[:k]) for k in range(len(levels))]
        parents, depths = [], []
        for k, (width, children) in enumerate(zip(levels, shape)):
            # the fed index of the level above's first node (root: 0)
            above = 0 if k == 0 else starts[k - 1] + 1
            parents += [above + j // children if k else 0 for j in range(width)]
            depths += [k + 1] * width
        fed = sum(levels[:-1])  # the draft reads every level but the last
        sees = torch.eye(fed, dtype=torch.bool)
        for node in range(fed):
            parent = parents[node] - 1
            while parent >= 0:
                sees[node, parent] = True
                parent = parents[parent] - 1
        as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)
        return Layout(shape, as_tensor(parents), as_tensor(depths), starts, sees.to(device))


@dataclass
class ShapeProposal(Proposal):
    """`levels_q`: the draft's distributions `[m, nodes, V]` at each level (the root's first);
    `saved`: a state-space draft's states after each level; `layout`: the block's shape."""

    levels_q: list[torch.Tensor]
    saved: list
    layout: Layout


def shape_accepted(q: torch.Tensor, y: list[int], t: int, shape: tuple[int, ...],
                   mixing: torch.Tensor) -> int:
    """Greedy replay of a shape tree: the path goes on while the target's token y[t + k] is among
    the top N_{k+1} tokens of the mixture at the path's node at depth k, which is the position
    t + k along y (reached only while the earlier tokens matched)."""
    accepted = 0
    while accepted < len(shape) and t + accepted < len(y):
        top = mix(q[t + accepted], mixing).topk(shape[accepted]).indices
        if not bool((top == y[t + accepted]).any()):
            break
        accepted += 1
    return accepted


class ShapeTreeProposer(ChainProposer, kind="shape"):
    """One static-shape tree per block."""

    def __init__(self, rows: Rows, config: DecodeConfig) -> None:
        super().__init__(rows, config)
        self.methods = len(config.methods)
        self._layouts: dict[tuple[int, ...], Layout] = {}
        self.use_shape(config.verify.shape if hasattr(config.verify, "shape") else config.verify.shapes[0])
        self.draws_per_block = 0  # children by rank; sampling draws the target's token at every node
        self.checks_per_block = config.verify.tree_nodes(config.gamma, self.methods) + 1

    def use_shape(self, shape: tuple[int, ...]) -> None:
        if shape not in self._layouts:
            self._layouts[shape] = Layout.of(shape, self.rows.model.device)
        self.layout, self.gamma = self._layouts[shape], len(shape)

    def propose(self, pending: torch.Tensor, weights: torch.Tensor, uniforms: torch.Tensor | None,
                keep_methods: bool) -> Proposal:
        layout, rows = self.layout, self.rows
        # [m, 1, V] at the root
        q = probabilities(rows.feed(pending)[:, -1], self.config.temperature)[:, None]
        levels_q, tokens, saved = [q], [], []
        if isinstance(rows, StateRows):
            saved.append(rows.snapshot())
        else:
            rows.begin_tree()
        for k, children in enumerate(layout.shape):
            top = mix(levels_q[-1].transpose(0, 1), weights).topk(children).indices  # [nodes above, children]
            tokens.append(top.flatten())
            if k < min(len(layout.shape), self.budget) - 1:
                levels_q.append(self._read_level(tokens[-1], k, saved))
            elif k < len(layout.shape) - 1:  # past the budget: each node reuses its parent's, no forward
                levels_q.append(levels_q[-1].repeat_interleave(children, dim=1))
        tree = Tree(torch.cat(tokens), layout.parents, layout.depths,
                    torch.ones_like(layout.depths, dtype=torch.bool), self.gamma)
        return ShapeProposal(tree.tokens, tree, None, levels_q, saved, layout)

    def _read_level(self, tokens: torch.Tensor, k: int, saved: list) -> torch.Tensor:
        """The draft's distributions `[m, nodes, V]` at level k + 1's nodes."""
        rows, m, children, width = self.rows, self.methods, self.layout.shape[k], tokens.shape[0]
        if isinstance(rows, StateRows):  # each node: its parent's m method rows, fed its token
            parents = torch.arange(width, device=tokens.device) // children
            rows.select_rows((parents[:, None] * m + torch.arange(m, device=tokens.device)[None]).flatten())
            logits = rows.feed(tokens.repeat_interleave(m)[:, None])[:, -1].view(width, m, -1).transpose(0, 1)
            saved.append(rows.snapshot())
        else:
            start = self.layout.starts[k]
            logits = rows.feed_tree(tokens, torch.full_like(tokens, k),
                                    self.layout.sees[start : start + width, : start + width], keep=width)
        return probabilities(logits, self.config.temperature)

    def _within_level(self, proposal: ShapeProposal, path: torch.Tensor, depth: int) -> torch.Tensor:
        """The path's node at `depth` as an index within its level (1-element device tensor)."""
        return (path[depth : depth + 1] - 1 - proposal.layout.starts[depth - 1])

    def history(self, proposal: ShapeProposal, path: torch.Tensor, accepted: int,
                positions: int) -> torch.Tensor:
        levels_q = proposal.levels_q
        at = lambda d: self._within_level(proposal, path, d)
        return torch.stack([levels_q[0][:, 0]] + [levels_q[d].index_select(1, at(d))[:, 0]
                                                  for d in range(1, positions)])

    def keep(self, proposal: ShapeProposal, path: torch.Tensor, accepted: int, before: int,
             block: torch.Tensor) -> torch.Tensor:
        kept = min(accepted, self.gamma - 1)
        if isinstance(self.rows, StateRows):  # the accepted node's method rows, as saved after its level
            root = torch.zeros(1, dtype=torch.long, device=path.device)
            node = self._within_level(proposal, path, kept) if kept else root
            index = node * self.methods + torch.arange(self.methods, device=path.device)
            self.rows.restore([state.index_select(0, index) for state in proposal.saved[kept]], before + kept)
        elif kept:  # the draft fed the tree's nodes in level order: node i at tree slot i - 1
            self.rows.keep_path(before + path[1 : kept + 1] - 1, before)
        return super().keep(proposal, path, accepted, before, block)

    def accept_sampled(self, proposal: Proposal, target_probs: torch.Tensor,
                       uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        outcome = verify_tree_sampled(proposal.tree, target_probs, uniforms[: proposal.tree.size + 1])
        return outcome.accepted, outcome.next_token, outcome.path

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> StaticRule:
        shape = config.verify.shape
        return StaticRule(len(shape), lambda q, y, t, gamma, mixing: shape_accepted(q, y, t, shape, mixing))


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
    """The bandit's block loop, shared by live decoding (`BanditTreeProposer`) and replay: which
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


class BanditTreeProposer(ShapeTreeProposer, kind="bandit"):
    """A shape tree per block, the shape chosen by `BanditRule` from the blocks before."""

    def __init__(self, rows: Rows, config: DecodeConfig) -> None:
        super().__init__(rows, config)
        self.rule = BanditRule(config)
        self.use_shape(self.rule.shapes[self.rule.arm])

    @property
    def arm(self) -> int:
        return self.rule.arm

    def keep(self, proposal: ShapeProposal, path: torch.Tensor, accepted: int, before: int,
             block: torch.Tensor) -> torch.Tensor:
        pending = super().keep(proposal, path, accepted, before, block)
        self.rule.observe(accepted)
        self.use_shape(self.rule.shapes[self.rule.arm])
        return pending

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> BanditRule:
        return BanditRule(config)
