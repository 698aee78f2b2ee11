"""Token trees: the shape of a tree proposal, its mask for ONE target forward, and which path
the target accepts (docs/algorithm.md, "Token trees").

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

from pipeline.decoding.verify import sample_token, sample_tokens, verify_sampling


@dataclass
class Tree:
    """`tokens`, `parents` (fed index, 0 = the root), `depths` (>= 1) and `valid`, each `[N]`
    on the device; `depth`: the largest depth a node may have (the block's gamma)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    valid: torch.Tensor
    depth: int

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
        for _ in range(self.depth):
            hop = parents[hop]
            seen.scatter_(1, hop[:, None], True)
        return seen

    def path_to(self, node: torch.Tensor) -> torch.Tensor:
        """`[depth + 1]`: the fed positions from the root (index 0) down to `node` (0-d), by
        depth; entries deeper than `node` hold 0."""
        parents, depths = self.fed_parents(), self.fed_depths()
        path = torch.zeros(self.depth + 1, dtype=torch.long, device=self.tokens.device)
        for _ in range(self.depth):
            path.index_put_((depths[node].view(1),), node.view(1))
            node = parents[node]
        return path


@dataclass
class TreeOutcome:
    """What the target accepted, on the device: `accepted` proposals (0-d), the target's own
    `next_token` after them (0-d), and `path`, the accepted nodes' fed positions by depth
    (`[depth + 1]`, root first; entries past `accepted` are 0)."""

    accepted: torch.Tensor
    next_token: torch.Tensor
    path: torch.Tensor


def verify_tree_greedy(tree: Tree, target_logits: torch.Tensor) -> TreeOutcome:
    """Follow the target's argmax down the tree (`follow_tree`): the output is the target's
    greedy output whatever the tree holds. `target_logits` `[N + 1, V]` at the fed positions."""
    return follow_tree(tree, target_logits.argmax(-1))


def verify_tree_sampled(tree: Tree, target_probs: torch.Tensor, uniforms: torch.Tensor) -> TreeOutcome:
    """SpecExec's rule (as Spec-LLaVA verifies its trees): the target samples one token at every
    fed position (`uniforms` `[N + 1]`, one per position), and the walk follows the child whose
    token is the one sampled at its parent. The target's distribution at a node is its exact
    distribution given the path to it, so every emitted token is a draw from the target given
    the tokens before it, however the tree was built: lossless for any tree whose siblings
    differ. `target_probs` `[N + 1, V]`."""
    return follow_tree(tree, sample_tokens(target_probs, uniforms))


def follow_tree(tree: Tree, chosen: torch.Tensor) -> TreeOutcome:
    """Walk down from the root: a node is accepted when its token is `chosen` at its parent's fed
    position (`chosen` `[N + 1]`) and its parent is accepted (the root always is). At most one
    child per node can match (siblings differ), so the accepted nodes form one path; the next
    token is `chosen` at its deepest node."""
    target_ids = chosen
    matches = tree.valid & (tree.tokens == target_ids[tree.parents])
    accepted = matches
    for _ in range(tree.depth - 1):
        accepted = matches & torch.cat([accepted.new_ones(1), accepted])[tree.parents]
    reach = torch.cat([tree.depths.new_zeros(1), accepted.long() * tree.depths])
    deepest = reach.argmax()  # the first maximum: the root when nothing was accepted
    return TreeOutcome(reach[deepest], target_ids[deepest], tree.path_to(deepest))


def verify_branches_sampling(
    tree: Tree, branches: int, target_probs: torch.Tensor, proposal_probs: torch.Tensor, uniforms: torch.Tensor,
) -> TreeOutcome:
    """Lossless sampling over `branches` independent chains that share only the root (SpecInfer's
    multi-step speculative sampling): the root's children are tested in order, child b accepted
    with probability min(1, p'(c_b) / r_b(c_b)) where r_b is the distribution it was drawn from,
    p' starting as p and becoming norm(max(p' - r_b, 0)) after each rejection; past the root the
    accepted branch is an ordinary chain (`verify_sampling`); when no child is accepted, the
    token is drawn from the last p'. The output is distributed exactly as sampling the target.

    Node (b, d) sits at fed position 1 + b * depth + d. `target_probs` `[N + 1, V]`,
    `proposal_probs` `[N, V]`, `uniforms` `[branches + depth]` float64: root tests, then the
    chain's tests and its emitted token."""
    depth = tree.depth
    residual, chosen = target_probs[0], torch.full((), -1, dtype=torch.long, device=target_probs.device)
    for b in range(branches):
        node = b * depth
        token, drawn_from = tree.tokens[node], proposal_probs[node]
        still_rejecting = chosen < 0
        take = still_rejecting & ((uniforms[b] * drawn_from[token].double()) < residual[token].double())
        chosen = torch.where(take, torch.full_like(chosen, b), chosen)
        rest = (residual - drawn_from).clamp_min(0)
        total = rest.sum()
        rest = torch.where(total > 0, rest / total.clamp_min(torch.finfo(rest.dtype).tiny), residual)
        residual = torch.where(still_rejecting & ~take, rest, residual)
    branch = chosen.clamp_min(0)
    fed = 1 + branch * depth + torch.arange(depth, device=target_probs.device)  # the branch's nodes
    more, chain_token = verify_sampling(tree.tokens[fed[1:] - 1], target_probs[fed], proposal_probs[fed[1:] - 1],
                                        uniforms[branches:])
    none = chosen < 0
    accepted = torch.where(none, torch.zeros_like(more), 1 + more)
    next_token = torch.where(none, sample_token(residual, uniforms[-1]), chain_token)
    steps = torch.arange(1, depth + 1, device=target_probs.device)
    path = torch.cat([fed.new_zeros(1), torch.where(steps <= accepted, fed, torch.zeros_like(fed))])
    return TreeOutcome(accepted, next_token, path)


def candidate_tree(chains: torch.Tensor, merge: bool) -> Tree:
    """The tree of `B` chains `[B, depth]` (branch b's node at depth d + 1 is `chains[b, d]`,
    fed at 1 + b * depth + d). `merge`: a node whose whole prefix repeats an earlier branch's
    is padding, and its children hang under that branch's node (a prefix tree, for greedy);
    otherwise the chains stay apart and share only the root (independent samples, for sampling)."""
    branches, depth = chains.shape
    device = chains.device
    steps = torch.arange(depth, device=device)
    if merge:
        same_prefix = (chains[:, None, :] == chains[None, :, :]).long().cumprod(-1)  # [B, B', d]
        owner = same_prefix.argmax(1)  # [B, d]: the first branch with this node's prefix (b itself at worst)
    else:
        owner = torch.arange(branches, device=device)[:, None].expand(branches, depth)
    valid = owner == torch.arange(branches, device=device)[:, None]
    parents = torch.cat([torch.zeros_like(owner[:, :1]), 1 + owner[:, :-1] * depth + steps[:-1]], 1)
    depths = (steps + 1).expand(branches, depth)
    return Tree(chains.reshape(-1), parents.reshape(-1), depths.reshape(-1), valid.reshape(-1), depth)
