"""The draft's side of ranked token trees: dynamic trees (Spec-LLaVA's, EAGLE-2's ranking) and
static-shape trees (the Mamba drafters paper's; `pipeline.decoding.draft_bandit` picks one per
block and request), for B requests at once (`pipeline.decoding.verify_kinds` holds their
specs).

Each request's tree grows level by level from its root: a level's nodes are children of the
level above's, ranked by the mixture of the request's drafting methods, and the draft reads a
level (`rows.feed_level`: KV rows with a tree mask, a state-space draft by batch expansion) to
know the distributions below it. Requests of one block may use different shapes (each request
has its own bandit): levels are padded to the widest, padding nodes are invalid, and each
request's tree lists its own nodes first, in level order, so a request's tree, its fed
positions and the uniforms a sampled block gives them are what they are when it runs alone.
Children are ranked, never drawn: a sampled block is verified by SpecExec's rule.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.acceptance import TreeOutcome, probabilities, verify_tree_sampled
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import Proposer, StaticRule
from pipeline.decoding.proposals import Pending, Proposal, Verified
from pipeline.decoding.rows_protocol import Rows
from pipeline.decoding.tree_shapes import shape_levels
from pipeline.decoding.trees import Tree
from pipeline.drafting.scoring import mix


def log_probability(probs: torch.Tensor) -> torch.Tensor:
    """float64 log of probabilities floored at 1e-30: path scores stay finite, so a child's
    always falls below its parent's (a draft head that rules tokens out gives them 0)."""
    return torch.log(probs.double().clamp_min(1e-30))


@dataclass
class Level:
    """One level of every request's generated tree: `tokens`, `parents` (index among the fed
    nodes of the level above; 0, the root, for the first level), `valid` and path `scores` (None
    unless ranked by them), each `[B, W]`; `fed` `[B, F]`: the nodes the draft reads, whose
    children make the next level (None: every node)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    valid: torch.Tensor
    scores: torch.Tensor | None
    fed: torch.Tensor | None = None

    def feeds(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(tokens, parents, scores) of the nodes the draft reads."""
        if self.fed is None:
            return self.tokens, self.parents, self.scores
        pick = lambda values: None if values is None else values.gather(1, self.fed)
        return pick(self.tokens), pick(self.parents), pick(self.scores)


@dataclass
class RankedProposal(Proposal):
    """`levels_q`: the draft's distributions `[B, W_d, m, V]` at each level the history may read
    (the root's first); `starts`: where level d (1-based) begins among the generated nodes,
    level-major; `generated` `[B, N]`: the generated node behind each tree node; `tree_first`:
    the block position of the draft's first tree node."""

    levels_q: list[torch.Tensor]
    starts: list[int]
    generated: torch.Tensor
    tree_first: int
    slots: torch.Tensor  # [B, generated]: each generated node's place among the nodes fed after the root

    def accept_sampled(self, target_probs: torch.Tensor, uniforms: torch.Tensor) -> TreeOutcome:
        """SpecExec's rule (`acceptance.verify_tree_sampled`): lossless whatever ranked the children."""
        return verify_tree_sampled(self.tree, target_probs, uniforms)

    def nodes_on(self, path: torch.Tensor, depths: int) -> torch.Tensor:
        """`[B, depths]`: the generated index of each path's node at depth 1..depths."""
        return self.generated.gather(1, (path[:, 1 : depths + 1] - 1).clamp_min(0))

    def history(self, path: torch.Tensor | None, accepted: torch.Tensor) -> torch.Tensor:
        rows, depths = [self.levels_q[0][:, 0]], len(self.levels_q) - 1
        nodes = self.nodes_on(path, depths)
        for d in range(1, depths + 1):
            q = self.levels_q[d]
            within = (nodes[:, d - 1] - self.starts[d - 1]).clamp(0, q.shape[1] - 1)
            rows.append(q.gather(1, within.view(-1, 1, 1, 1).expand(-1, 1, *q.shape[2:]))[:, 0])
        return torch.stack(rows, 1)


def _generated(parents: torch.Tensor, above: Level) -> torch.Tensor:
    """Parents among the fed nodes of the level `above` as its generated indices."""
    return parents if above.fed is None else above.fed.gather(1, parents)


def _slots(levels: list[Level]) -> torch.Tensor:
    """`[B, generated]`: each generated node's place among the nodes the draft read after the
    root, level by level (-1: never read; every node, unless a level reads a subset)."""
    slots, done = [], 0
    for level in levels:
        if level.fed is None:
            place = torch.arange(level.tokens.shape[1], device=level.tokens.device).expand_as(level.tokens)
        else:
            place = torch.full_like(level.tokens, -1).scatter_(
                1, level.fed, torch.arange(level.fed.shape[1], device=level.fed.device).expand_as(level.fed))
        slots.append(torch.where(place >= 0, place + done, place))
        done += level.tokens.shape[1] if level.fed is None else level.fed.shape[1]
    return torch.cat(slots, 1)


class RankedTreeProposer(Proposer):
    """Trees whose children are ranked by the mixture, drafted level by level. A subclass says
    how a level's children are chosen (`children`), each request's depth (`gammas`) and which
    generated nodes make the tree (`select`)."""

    def __init__(self, config: DecodeConfig) -> None:
        super().__init__(config)
        # children by rank, never drawn; sampling draws the target's token at every fed position
        self.draws_per_block = 0
        self.checks_per_block = config.verify.tree_nodes(config.gamma, self.methods) + 1

    def start(self, rows: Rows) -> None:
        self.rows = rows
        self.fed_pending: list[int] = []

    def gammas(self, requests: int) -> list[int]:
        """Each request's depth this block."""
        return [self.config.gamma] * requests

    def reads(self, budgets: list[int], depth: int) -> int:
        """Levels the draft reads (one forward each) this block, the root's included."""
        return depth

    def children(self, k: int, mixture: torch.Tensor, scores: torch.Tensor, gammas: list[int]) -> Level:
        """Level k + 1 from the mixture at level k's nodes `[B, W_k, V]` and their path scores."""
        raise NotImplementedError

    def select(self, levels: list[Level], depths: torch.Tensor) -> torch.Tensor:
        """`[B, N]` generated indices (level-major) of the tree's nodes, each request's in level
        order, its own first and padding last."""
        raise NotImplementedError

    def propose(self, pending: Pending, weights: torch.Tensor, budgets: list[int],
                uniforms: torch.Tensor | None) -> Proposal:
        config, rows, requests = self.config, self.rows, len(pending.counts)
        self.fed_pending = pending.counts
        logits = pending.feed_into(rows, self.methods)[:, -1]
        levels_q = [probabilities(logits, config.temperature).view(requests, 1, self.methods, -1)]
        rows.begin_tree()
        gammas = self.gammas(requests)
        depth = max(gammas)
        reads = min(depth, self.reads(budgets, depth))
        scores = torch.zeros(requests, 1, dtype=torch.float64, device=logits.device)
        levels = []
        for k in range(depth):
            level = self.children(k, mix(levels_q[-1], weights), scores, gammas)
            levels.append(level)
            tokens, parents, scores = level.feeds()
            if k < reads - 1:
                levels_q.append(probabilities(rows.feed_level(tokens, parents), config.temperature))
            elif k < depth - 1:  # past the budget: each node reuses its parent's, no forward
                above = levels_q[-1]
                index = parents.view(*parents.shape, 1, 1).expand(-1, -1, *above.shape[2:])
                levels_q.append(above.gather(1, index))
        return self._proposal(levels, levels_q, gammas, pending.tokens.shape[1])

    def _proposal(self, levels: list[Level], levels_q: list[torch.Tensor], gammas: list[int],
                  tree_first: int) -> RankedProposal:
        """The tree of the generated levels: each node's fed parent and depth, its own nodes first."""
        widths = [level.tokens.shape[1] for level in levels]
        starts = [sum(widths[:d]) for d in range(len(widths))]
        device = levels[0].tokens.device
        depths = torch.cat([torch.full((w,), d + 1, device=device) for d, w in enumerate(widths)])
        # generated parent of each generated node (-1: the root)
        parents = torch.cat([_generated(level.parents, levels[d - 1]) + starts[d - 1] if d
                             else torch.full_like(level.parents, -1) for d, level in enumerate(levels)], 1)
        kept = self.select(levels, depths)
        requests, count = kept.shape
        fed = torch.zeros(requests, depths.shape[0] + 1, dtype=torch.long, device=device)
        fed.scatter_(1, kept + 1, torch.arange(1, count + 1, device=device).expand(requests, count))
        tree = Tree(torch.cat([level.tokens for level in levels], 1).gather(1, kept),
                    fed.gather(1, parents.gather(1, kept) + 1), depths[kept],
                    torch.cat([level.valid for level in levels], 1).gather(1, kept), max(gammas))
        return RankedProposal(
            tree.tokens, tree, None, gammas, self.arms(), levels_q, starts, kept, tree_first, _slots(levels)
        )

    def arms(self) -> list[int] | None:
        """Each request's bandit arm this block (None: no bandit)."""
        return None

    def kept_path(self, accepted: int, gamma: int) -> int:
        """Accepted path nodes the draft's rows keep (a later one comes again as pending): every
        one it read, which is all but the deepest level's."""
        return min(accepted, gamma - 1)

    def learn(self, proposal: RankedProposal, verified: Verified) -> Pending:
        """Keep the pending tokens and the accepted path's nodes the draft fed (`kept_path`):
        their block positions, in order, for every row of the request."""
        kept = [self.kept_path(a, g) if run else 0
                for a, g, run in zip(verified.accepted, proposal.gammas, verified.running)]
        counts = self.fed_pending
        deepest, width = max(kept), proposal.tree_first
        device = proposal.tokens.device
        columns = torch.arange(width + deepest, device=device)[None]
        real = torch.tensor(counts, device=device)[:, None]
        order = width - real + columns
        if deepest:
            slots = proposal.tree_first + proposal.slots.gather(1, proposal.nodes_on(verified.path, deepest))
            order = torch.where(
                columns < real, order, slots.gather(1, (columns - real).clamp(0, deepest - 1))
            )
        keep = [c + k if run else 0 for c, k, run in zip(counts, kept, verified.running)]
        per = self.methods
        self.rows.settle([k for k in keep for _ in range(per)], order.repeat_interleave(per, 0))
        refeed = [run and k < a for a, k, run in zip(verified.accepted, kept, verified.running)]
        return Pending.after(verified, refeed, self.rows.rereads_kept)


class DynamicTreeProposer(RankedTreeProposer):
    """A tree shaped by the mixture's confidence (Spec-LLaVA's dynamic tree, EAGLE-2's
    ranking): from the root, each of `gamma` levels keeps the `top_k` children of the level
    above with the highest path probability (the product of mixture probabilities along the
    path), so an unsure node keeps several children and a sure one a single child; the levels
    but the last are fed to the draft. The tree is the `nodes` most probable of them, ancestors
    before descendants."""

    def __init__(self, config: DecodeConfig) -> None:
        super().__init__(config)
        spec = config.verify.for_gamma(config.gamma)  # a DynamicTree
        self.width, self.nodes = spec.top_k, spec.nodes

    def children(self, k: int, mixture: torch.Tensor, scores: torch.Tensor, gammas: list[int]) -> Level:
        paths = scores[..., None] + log_probability(mixture)  # [B, W_k, V]
        best, flat = paths.flatten(1).topk(self.width)
        vocabulary = mixture.shape[-1]
        return Level(flat % vocabulary, flat // vocabulary, torch.ones_like(flat, dtype=torch.bool), best)

    def select(self, levels: list[Level], depths: torch.Tensor) -> torch.Tensor:
        """The `nodes` most probable. Scores fall along every path, and ties go to the shallower
        node, so the kept set holds every kept node's ancestors."""
        key = torch.cat([level.scores for level in levels], 1) - 1e-9 * depths
        return key.topk(self.nodes).indices.sort().values  # level order: parents first


class ShapeTreeProposer(RankedTreeProposer):
    """One static-shape tree per block: a shape `(N1, ..., Nd)` gives every node at depth k - 1
    the top N_k tokens of the mixture at it."""

    def shapes(self, requests: int) -> list[tuple[int, ...]]:
        """Each request's shape this block."""
        return [self.config.verify.shape] * requests

    def gammas(self, requests: int) -> list[int]:
        return [len(shape) for shape in self.shapes(requests)]

    def reads(self, budgets: list[int], depth: int) -> int:
        return max(budgets)

    def children(self, k: int, mixture: torch.Tensor, scores: torch.Tensor, gammas: list[int]) -> Level:
        shapes = self.shapes(len(gammas))
        counts = [shape[k] if k < len(shape) else 0 for shape in shapes]
        widths = [shape_levels(shape)[k] if k < len(shape) else 0 for shape in shapes]
        device = mixture.device
        top = mixture.topk(max(counts)).indices  # [B, W_k, N]
        j = torch.arange(max(widths), device=device)[None]
        children = torch.tensor(counts, device=device).clamp_min(1)[:, None]
        parents = (j // children).clamp_max(mixture.shape[1] - 1)
        tokens = top.flatten(1).gather(1, parents * top.shape[-1] + j % children)
        return Level(tokens, parents, j < torch.tensor(widths, device=device)[:, None], None)

    def select(self, levels: list[Level], depths: torch.Tensor) -> torch.Tensor:
        """Every valid node: a stable sort puts each request's own before its padding."""
        valid = torch.cat([level.valid for level in levels], 1)
        nodes = max(sum(shape_levels(shape)) for shape in self.shapes(valid.shape[0]))
        return torch.sort((~valid).long(), dim=1, stable=True).indices[:, :nodes]

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> StaticRule:
        shape = config.verify.shape
        return StaticRule(len(shape), lambda q, y, t, gamma, mixing: shape_accepted(q, y, t, shape, mixing))


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
