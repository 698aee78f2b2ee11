"""The draft's side of a dynamic tree (Spec-LLaVA's, EAGLE-2's ranking): gamma levels of `top_k`
nodes by path probability under the mixture, fed level by level with a tree mask, then the
`nodes` most probable nodes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.decoding.acceptance import probabilities, verify_tree_sampled
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import ChainProposer, Proposal
from pipeline.decoding.rows import Rows
from pipeline.decoding.trees import Tree
from pipeline.drafting.scoring import mix


def log_probability(probs: torch.Tensor) -> torch.Tensor:
    """float64 log of probabilities floored at 1e-30: path scores stay finite, so a child's
    always falls below its parent's (a draft head that rules tokens out gives them 0)."""
    return torch.log(probs.double().clamp_min(1e-30))


@dataclass
class DynamicProposal(Proposal):
    """`kept`: the generated node behind each tree node; `levels_q`: the draft's distributions
    `[m, nodes, V]` at each level (the root's first)."""

    kept: torch.Tensor
    levels_q: list[torch.Tensor]


class DynamicTreeProposer(ChainProposer, kind="dynamic"):
    """A tree shaped by the mixture's confidence (Spec-LLaVA's dynamic tree, EAGLE-2's
    ranking): from the root, each of `gamma` levels keeps the `top_k` children of the level
    above with the highest path probability (the product of mixture probabilities along the
    path), so an unsure node keeps several children and a sure one a single child; the levels
    but the last are fed to the draft rows as a tree, one forward per level. The tree is the
    `nodes` most probable of them, ancestors before descendants. Children are kept by rank, so
    a sampled block is verified by SpecExec's rule (`accept_sampled`)."""

    def __init__(self, rows: Rows, config: DecodeConfig) -> None:
        super().__init__(rows, config)
        spec = config.verify.for_gamma(config.gamma)  # a DynamicTree
        self.width, self.nodes = spec.top_k, spec.nodes
        # children by rank, never drawn; sampling draws the target's token at every fed position
        self.draws_per_block, self.checks_per_block = 0, self.nodes + 1
        width, levels = self.width, self.gamma
        device = rows.model.device
        # generated node g = (level - 1) * width + k: its depth, and its place in the draft's tree
        self._depths = torch.arange(1, levels + 1, device=device).repeat_interleave(width)
        self._self_seen = torch.eye(width, dtype=torch.bool, device=device)

    def propose(self, pending: torch.Tensor, weights: torch.Tensor, uniforms: torch.Tensor | None,
                keep_methods: bool) -> Proposal:
        width, rows = self.width, self.rows
        q = probabilities(rows.feed(pending)[:, -1], 1.0)  # [m, V] at the root
        rows.begin_tree()
        scores, token = log_probability(mix(q, weights)).topk(width)
        levels_q, tokens, parents, all_scores = [q[:, None]], [token], [torch.full_like(token, -1)], [scores]
        sees = None  # [fed tree nodes, fed tree nodes]: who sees whom in the draft's tree
        for level in range(1, self.gamma):
            parent = parents[-1] - (level - 2) * width if level > 1 else None
            sees = self._grow(sees, parent)
            logits = rows.feed_tree(token, torch.full_like(token, level - 1), sees[-width:], keep=width)
            q = probabilities(logits, 1.0)  # [m, width, V]
            children = scores[:, None] + log_probability(mix(q.transpose(0, 1), weights))  # [width, V]
            scores, flat = children.flatten().topk(width)
            token, parent_k = flat % children.shape[1], flat // children.shape[1]
            levels_q.append(q)
            tokens.append(token)
            parents.append(parent_k + (level - 1) * width)
            all_scores.append(scores)
        return self._prune(torch.cat(tokens), torch.cat(parents), torch.cat(all_scores), levels_q)

    def _grow(self, sees: torch.Tensor | None, parent: torch.Tensor | None) -> torch.Tensor:
        """The draft tree's visibility with one more level of `width` nodes (children of `parent`,
        indices within the level above): each sees its parent's ancestors and itself."""
        if sees is None:
            return self._self_seen
        inherited = sees[-self.width:][parent]  # the parents' rows over the tree so far
        rows = torch.cat([inherited, self._self_seen], 1)
        return torch.cat([torch.cat([sees, sees.new_zeros(sees.shape[0], self.width)], 1), rows])

    def _prune(self, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor,
               levels_q: list) -> Proposal:
        """The `nodes` most probable generated nodes as a tree. Scores fall along every path, and
        ties go to the shallower node, so the kept set holds every kept node's ancestors."""
        key = scores - 1e-9 * self._depths
        kept = key.topk(self.nodes).indices.sort().values  # level order: parents first
        fed = torch.zeros(tokens.shape[0] + 1, dtype=torch.long, device=tokens.device)
        # generated node -> fed position
        fed[kept + 1] = torch.arange(1, self.nodes + 1, device=tokens.device)
        tree = Tree(tokens[kept], fed[parents[kept] + 1], self._depths[kept],
                    torch.ones_like(kept, dtype=torch.bool), self.gamma)
        return DynamicProposal(tree.tokens, tree, None, kept, levels_q)

    def _generated(self, proposal: DynamicProposal, path: torch.Tensor, upto: int) -> torch.Tensor:
        """Generated indices of the accepted path's nodes at depths 1..upto."""
        return proposal.kept[path[1 : upto + 1] - 1]

    def history(self, proposal: DynamicProposal, path: torch.Tensor, accepted: int,
                positions: int) -> torch.Tensor:
        levels_q = proposal.levels_q
        generated = self._generated(proposal, path, positions - 1)
        at = lambda d: generated[d - 1 : d] - (d - 1) * self.width  # the node's index within level d
        rows = [levels_q[0][:, 0]] + [levels_q[d].index_select(1, at(d))[:, 0]
                                      for d in range(1, positions)]
        return torch.stack(rows)

    def accept_sampled(self, proposal: Proposal, target_probs: torch.Tensor,
                       uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """SpecExec's rule (`acceptance.verify_tree_sampled`): lossless whatever ranked the children."""
        outcome = verify_tree_sampled(proposal.tree, target_probs, uniforms)
        return outcome.accepted, outcome.next_token, outcome.path

    def keep(self, proposal: DynamicProposal, path: torch.Tensor, accepted: int, before: int,
             block: torch.Tensor) -> torch.Tensor:
        kept = min(accepted, self.gamma - 1)
        if kept:  # the draft fed generated node g at tree slot g: move the path up behind the root
            self.rows.keep_path(before + self._generated(proposal, path, kept), before)
        return super().keep(proposal, path, accepted, before, block)
