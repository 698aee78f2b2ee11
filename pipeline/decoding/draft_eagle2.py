"""EAGLE-2's tree drafted for B requests (`pipeline.decoding.eagle2_kind.Eagle2Tree`): at each
level every read node gets its `top_k` children by the mixture's log-probability; only the
level's `top_k` best candidates by path score are read on (the others stay leaves); the tree is
the best `total_tokens - 1` of every candidate. A request's rows keep the accepted path's nodes
but the last, which may be a leaf the draft never read, so it comes again as pending."""
from __future__ import annotations

import torch

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft_trees import Level, RankedTreeProposer, log_probability


class Eagle2TreeProposer(RankedTreeProposer):
    """Children of every read node; a level reads on its `top_k` best; the tree, the best of all."""

    def __init__(self, config: DecodeConfig) -> None:
        super().__init__(config)
        self.width, self.nodes = config.verify.top_k, config.verify.total_tokens - 1

    def children(self, k: int, mixture: torch.Tensor, scores: torch.Tensor, gammas: list[int]) -> Level:
        """Each read node's `top_k` children (`[B, F * top_k]`), their path scores, and which
        `top_k` of them the draft reads next."""
        top = log_probability(mixture).topk(self.width)  # per read node: [B, F, top_k]
        paths = (scores[..., None] + top.values).flatten(1)
        reads = top.indices.shape[1]
        parents = torch.arange(reads, device=paths.device).repeat_interleave(self.width).expand_as(paths)
        frontier = paths.topk(self.width).indices.sort().values
        valid = torch.ones_like(paths, dtype=torch.bool)
        return Level(top.indices.flatten(1), parents, valid, paths, frontier)

    def select(self, levels: list[Level], depths: torch.Tensor) -> torch.Tensor:
        """The `total_tokens - 1` best candidates; path scores fall along every path and ties go to
        the shallower node, so every kept node's ancestors are kept."""
        key = torch.cat([level.scores for level in levels], 1) - 1e-9 * depths
        return key.topk(self.nodes).indices.sort().values

    def kept_path(self, accepted: int, gamma: int) -> int:
        """All accepted nodes but the last: each of those has a child on the path, so was read."""
        return max(accepted - 1, 0)
