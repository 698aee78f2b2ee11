"""Token trees: the structure of each request's tree proposal and its mask for ONE target forward
(docs/algorithm.md, "Token trees"; `pipeline.decoding.acceptance` walks the accepted path).

A tree block feeds the target each request's pending token (the root, fed position 0) and `N`
proposed nodes (fed positions 1..N) in one forward: node i sees the cache, the root, its
ancestors and itself, at position prefix + depth(i). Every tensor has a leading request
dimension `B`; nodes come parents first, so every structure here is a few rounds of gathers
per tree level on the device, in fixed shapes, with no host read. Padding nodes (`valid`
False) are nobody's ancestor and never accepted, so requests whose trees hold fewer nodes
share the forward of the largest, and trees of one kind keep one compiled shape.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Tree:
    """`tokens`, `parents` (fed index, 0 = the root), `depths` (>= 1) and `valid`, each `[B, N]`
    on the device; `gamma`: the largest depth a node may have (the block's draft steps)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    valid: torch.Tensor
    gamma: int

    @property
    def size(self) -> int:
        return self.tokens.shape[1]

    def fed_parents(self) -> torch.Tensor:
        """`[B, N + 1]`: each fed position's parent; the root is its own."""
        return torch.cat([self.parents.new_zeros(self.parents.shape[0], 1), self.parents], 1)

    def fed_depths(self) -> torch.Tensor:
        """`[B, N + 1]`: each fed position's depth (the root's is 0): its offset from the root's position."""
        return torch.cat([self.depths.new_zeros(self.depths.shape[0], 1), self.depths], 1)

    def ancestry(self) -> torch.Tensor:
        """`[B, N + 1, N + 1]` bool: fed position i may attend to fed position j (j is i or an ancestor)."""
        requests, n = self.tokens.shape[0], self.size + 1
        device = self.tokens.device
        parents = self.fed_parents()
        hop = torch.arange(n, device=device).expand(requests, n)
        seen = torch.eye(n, dtype=torch.bool, device=device).repeat(requests, 1, 1)
        for _ in range(self.gamma):
            hop = parents.gather(1, hop)
            seen.scatter_(2, hop[..., None], True)
        return seen

    def path_to(self, node: torch.Tensor) -> torch.Tensor:
        """`[B, gamma + 1]`: the fed positions from the root (index 0) down to each request's
        `node` (`[B]`), by depth; entries deeper than the node hold 0."""
        parents, depths = self.fed_parents(), self.fed_depths()
        path = torch.zeros(node.shape[0], self.gamma + 1, dtype=torch.long, device=node.device)
        node = node[:, None]
        for _ in range(self.gamma):
            path.scatter_(1, depths.gather(1, node), node)
            node = parents.gather(1, node)
        return path


def candidate_tree(chains: torch.Tensor, merge: bool) -> Tree:
    """The trees of `B` requests' chains `[B, branches, gamma]` (branch b's node at depth d + 1
    is `chains[:, b, d]`, fed at 1 + b * gamma + d). `merge`: a node whose whole prefix repeats an
    earlier branch's is padding, and its children hang under that branch's node (a prefix tree,
    for greedy); otherwise the chains stay apart and share only the root (independent samples,
    for sampling)."""
    requests, branches, gamma = chains.shape
    device = chains.device
    steps = torch.arange(gamma, device=device)
    own = torch.arange(branches, device=device)[:, None]  # [branches, 1]
    if merge:
        same_prefix = (chains[:, :, None, :] == chains[:, None, :, :]).long().cumprod(-1)  # [B, b, b', d]
        # [B, b, d]: the first branch with this node's prefix (b itself at worst)
        owner = same_prefix.argmax(2)
    else:
        owner = own.expand(branches, gamma).expand(requests, branches, gamma)
    valid = owner == own
    first = torch.zeros_like(owner[..., :1])
    parents = torch.cat([first, 1 + owner[..., :-1] * gamma + steps[:-1]], -1)
    depths = (steps + 1).expand(requests, branches, gamma)
    flat = lambda t: t.reshape(requests, branches * gamma)
    return Tree(flat(chains), flat(parents), flat(depths), flat(valid), gamma)


class LevelMask:
    """Who sees whom in a draft tree fed level by level since `begin` (each request its own):
    a node sees its ancestors and itself; what came before the tree is the rows' business."""

    def __init__(self) -> None:
        self.sees: torch.Tensor | None = None  # [B, nodes so far, nodes so far]
        self.depth = 0

    def begin(self) -> None:
        self.sees, self.depth = None, 0

    def grow(self, parents: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The next level's `[B, W, nodes so far + W]` rows (children of the level above's nodes
        `parents` `[B, W]`, indices within that level) and its depth (1 for the first level)."""
        requests, width = parents.shape
        own = torch.eye(width, dtype=torch.bool, device=parents.device).expand(requests, width, width)
        if self.sees is None:
            rows = own
            self.sees = own
        else:
            above = self.sees[:, -self._width:]  # the level above's rows over the tree so far
            inherited = above.gather(1, parents[..., None].expand(-1, -1, above.shape[-1]))
            rows = torch.cat([inherited, own], 2)
            grown = torch.cat([self.sees, self.sees.new_zeros(requests, self.sees.shape[1], width)], 2)
            self.sees = torch.cat([grown, rows], 1)
        self._width, self.depth = width, self.depth + 1
        return rows, self.depth
