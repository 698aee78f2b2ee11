"""Token trees: the structure of a tree proposal and its mask for ONE target forward
(docs/algorithm.md, "Token trees"; `pipeline.decoding.acceptance` walks the accepted path).

A tree block feeds the target its pending token (the root, fed position 0) and `N` proposed
nodes (fed positions 1..N) in one forward: node i sees the cache, the root, its ancestors and
itself, at position prefix + depth(i). Nodes come parents first, so every structure here is a
few rounds of gathers per tree level on the device, in fixed shapes, with no host read:
padding nodes (`valid` False) are nobody's ancestor and never accepted, so trees of one kind
and size always have `N` nodes and compiled steps keep their shapes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Tree:
    """`tokens`, `parents` (fed index, 0 = the root), `depths` (>= 1) and `valid`, each `[N]`
    on the device; `gamma`: the largest depth a node may have (the block's draft steps)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    valid: torch.Tensor
    gamma: int

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    def fed_parents(self) -> torch.Tensor:
        """`[N + 1]`: each fed position's parent; the root is its own."""
        return torch.cat([self.parents.new_zeros(1), self.parents])

    def fed_depths(self) -> torch.Tensor:
        """`[N + 1]`: each fed position's depth (the root's is 0): its offset from the root's position."""
        return torch.cat([self.depths.new_zeros(1), self.depths])

    def ancestry(self) -> torch.Tensor:
        """`[N + 1, N + 1]` bool: fed position i may attend to fed position j (j is i or an ancestor)."""
        n = self.size + 1
        parents, hop = self.fed_parents(), torch.arange(n, device=self.tokens.device)
        seen = torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        for _ in range(self.gamma):
            hop = parents[hop]
            seen.scatter_(1, hop[:, None], True)
        return seen

    def path_to(self, node: torch.Tensor) -> torch.Tensor:
        """`[gamma + 1]`: the fed positions from the root (index 0) down to `node` (0-d), by
        depth; entries deeper than `node` hold 0."""
        parents, depths = self.fed_parents(), self.fed_depths()
        path = torch.zeros(self.gamma + 1, dtype=torch.long, device=self.tokens.device)
        for _ in range(self.gamma):
            path.index_put_((depths[node].view(1),), node.view(1))
            node = parents[node]
        return path


def candidate_tree(chains: torch.Tensor, merge: bool) -> Tree:
    """The tree of `B` chains `[B, gamma]` (branch b's node at depth d + 1 is `chains[b, d]`,
    fed at 1 + b * gamma + d). `merge`: a node whose whole prefix repeats an earlier branch's
    is padding, and its children hang under that branch's node (a prefix tree, for greedy);
    otherwise the chains stay apart and share only the root (independent samples, for sampling)."""
    branches, gamma = chains.shape
    device = chains.device
    steps = torch.arange(gamma, device=device)
    if merge:
        same_prefix = (chains[:, None, :] == chains[None, :, :]).long().cumprod(-1)  # [B, B', d]
        owner = same_prefix.argmax(1)  # [B, d]: the first branch with this node's prefix (b itself at worst)
    else:
        owner = torch.arange(branches, device=device)[:, None].expand(branches, gamma)
    valid = owner == torch.arange(branches, device=device)[:, None]
    parents = torch.cat([torch.zeros_like(owner[:, :1]), 1 + owner[:, :-1] * gamma + steps[:-1]], 1)
    depths = (steps + 1).expand(branches, gamma)
    return Tree(chains.reshape(-1), parents.reshape(-1), depths.reshape(-1), valid.reshape(-1), gamma)
