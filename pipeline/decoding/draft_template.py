"""The draft's side of a template tree (`pipeline.decoding.template_kind`): each level's nodes
are the listed ranks of the mixture at their parents, the same template for every request, so
a request's tree is what it is alone."""
from __future__ import annotations

import torch

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import StaticRule
from pipeline.decoding.draft_trees import Level, RankedTreeProposer
from pipeline.decoding.template_kind import Path
from pipeline.drafting.scoring import mix


def _parents_and_ranks(levels: list[list[Path]]) -> list[tuple[list[int], list[int]]]:
    """Per level: each node's parent (its place in the level above; 0, the root, on the first) and rank."""
    places = [{path: i for i, path in enumerate(level)} for level in levels]
    return [([places[d - 1][p[:-1]] if d else 0 for p in level], [p[-1] for p in level])
            for d, level in enumerate(levels)]


class TemplateTreeProposer(RankedTreeProposer):
    """One template tree per block; the draft reads every level but the deepest."""

    def __init__(self, config: DecodeConfig) -> None:
        super().__init__(config)
        self.levels = _parents_and_ranks(config.verify.levels)

    def gammas(self, requests: int) -> list[int]:
        return [len(self.levels)] * requests

    def reads(self, budgets: list[int], depth: int) -> int:
        return max(budgets)

    def children(self, k: int, mixture: torch.Tensor, scores: torch.Tensor, gammas: list[int]) -> Level:
        parents, ranks = self.levels[k]
        top = mixture.topk(max(ranks) + 1).indices  # [B, W_k, R]; the ranks on the host: no device sync
        parents, ranks = (torch.tensor(values, device=mixture.device) for values in (parents, ranks))
        tokens = top[:, parents, ranks]
        requests = mixture.shape[0]
        return Level(tokens, parents.expand(requests, -1), torch.ones_like(tokens, dtype=torch.bool), None)

    def select(self, levels: list[Level], depths: torch.Tensor) -> torch.Tensor:
        requests, nodes = levels[0].tokens.shape[0], depths.shape[0]
        return torch.arange(nodes, device=depths.device).expand(requests, -1)

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> StaticRule:
        children: dict[Path, list[int]] = {}
        for path in config.verify.nodes:
            children.setdefault(path[:-1], []).append(path[-1])
        return StaticRule(len(config.verify.levels),
                          lambda q, y, t, gamma, mixing: template_accepted(q, y, t, children, mixing))


def template_accepted(q: torch.Tensor, y: list[int], t: int, children: dict[Path, list[int]],
                      mixing: torch.Tensor) -> int:
    """Greedy replay of a template tree: from the root, the path goes on while y's next token is
    the mixture's child of a rank the template lists below the path's node (the mixture at
    position t + k along y, reached only while the earlier tokens matched)."""
    node: Path = ()
    while (ranks := children.get(node)) and t + len(node) < len(y):
        top = mix(q[t + len(node)], mixing).topk(max(ranks) + 1).indices.tolist()
        found = [r for r in ranks if top[r] == y[t + len(node)]]
        if not found:
            break
        node = (*node, found[0])
    return len(node)
