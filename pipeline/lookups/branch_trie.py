"""`lookahead`: the branch trie of Ant Group's lookahead decoding (alipay/PainlessInferenceAcceleration,
`lookahead/common/lookahead_cache.py`; the method MMSpec runs as "lookahead", KDD'24, arXiv
2312.12728), over the context alone. Not hao-ai-lab's Jacobi lookahead decoding, another method.

Every token of the prompt and the output starts a branch: the up to `branch_length` tokens that
follow it, inserted into the trie of that token (each node counts how often its path occurred).
The draft for a context is ranked, not a single continuation: the children of the trie node its
longest suffix (at most `match_window` tokens) reaches, weighted by how often each followed, so a tree
verify kind (`dynamic`) grows a multi-branch draft from them level by level, each deeper level
matched again with its path. Differences from the reference's `hier_get`: it keeps the longest
suffix with children (the reference moves on to shorter suffixes unless the longer one yields
`branch_length` candidates), prompt and output branches count alike (its `mix` mode weighs them),
and the tree's size is the verify kind's (`nodes`, its `decoding_length`).
Defaults: `branch_length` 12, MMSpec's setting (the reference's README uses 32 on private data);
`match_window` 10, the widest match window of SGLang's port of the same cache.
"""
from __future__ import annotations

from typing import ClassVar, Sequence

from pipeline.lookups.base import Lookup


class Branch:
    """A trie node: how often its path occurred, and its children by token."""

    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, Branch] = {}


class BranchTrieLookup(Lookup):
    """`_roots[token]`: the trie of what followed `token`; `_open`: the branches still growing
    (started within the last `branch_length` tokens), each (node, depth). Asked about a suffix,
    it extends by the suffix with a log of what it changed and undoes it."""

    kind: ClassVar[str] = "lookahead"
    ranks = True
    PARAMS: ClassVar[dict[str, tuple[int, int]]] = {"branch_length": (12, 1), "match_window": (10, 1)}

    def __init__(self, **params: int) -> None:
        super().__init__(**params)
        self._tokens: list[int] = []
        self._roots: dict[int, Branch] = {}
        self._open: list[tuple[Branch, int]] = []
        self._log: list[tuple[Branch | None, int, bool]] | None = None  # (parent or None: a root, token, new)

    @property
    def max_tokens(self) -> int:
        return self.params["branch_length"]

    def extend(self, tokens: Sequence[int]) -> None:
        longest = self.params["branch_length"]
        for token in map(int, tokens):
            grown = []
            for node, depth in self._open:
                child = self._child(node, token)
                child.count += 1
                if depth + 1 < longest:
                    grown.append((child, depth + 1))
            if token not in self._roots and self._log is not None:
                self._log.append((None, token, True))
            self._open = [*grown, (self._roots.setdefault(token, Branch()), 0)]
            self._tokens.append(token)

    def counts(self, suffix: Sequence[int] = ()) -> dict[int, int]:
        """How often each token followed the longest suffix (at most `match_window` tokens) of context +
        `suffix` that was followed by anything; {} when none was. Negative ids (images) are left out."""
        state = (len(self._tokens), list(self._open))
        self._log = []
        self.extend(suffix)
        found: dict[int, int] = {}
        for width in range(min(self.params["match_window"], len(self._tokens)), 0, -1):
            path = self._tokens[-width:]
            node = self._roots.get(path[0])
            for token in path[1:]:
                node = None if node is None else node.children.get(token)
            if node is not None and (found := {t: c.count for t, c in node.children.items() if t >= 0}):
                break
        self._undo(*state)
        return found

    def propose(self, suffix: Sequence[int] = ()) -> list[int]:
        """The most frequent branch, token by token (a chain's view of the trie)."""
        plan: list[int] = []
        while len(plan) < self.max_tokens and (found := self.counts([*suffix, *plan])):
            plan.append(max(found, key=lambda t: (found[t], -t)))
        return plan

    def _child(self, node: Branch, token: int) -> Branch:
        child = node.children.get(token)
        if child is None:
            child = node.children[token] = Branch()
        if self._log is not None:
            self._log.append((node, token, child.count == 0))
        return child

    def _undo(self, length: int, opened: list[tuple[Branch, int]]) -> None:
        for parent, token, new in reversed(self._log):
            if parent is None:
                del self._roots[token]
            elif new:
                del parent.children[token]
            else:
                parent.children[token].count -= 1
        del self._tokens[length:]
        self._open, self._log = opened, None
