"""A static token tree written node by node as rank paths (torch-free, like every kind; its
proposer is `pipeline.decoding.draft_template`): node `(i, j)` is the j-th ranked child of the
root's i-th ranked child, the layout of Token Recycling's `tree_template` and Medusa's
`medusa_choices`. A template need not be full, unlike a shape tree: Token Recycling's "2.2.2"
gives its top candidates deep branches and its lower ones a leaf."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.decoding.tree_shapes import MAX_TREE_DEPTH, MAX_TREE_NODES
from pipeline.decoding.verify_kinds import MAX_TOP_K, VerifySpec

Path = tuple[int, ...]

# Token Recycling's default tree, version "2.2.2": 80 nodes on 6 levels of 8, 21, 25, 15, 8, 3
# (Luowaterbi/TokenRecycling, model/recycling/tree_template_.py)
_RECYCLING_LEVELS = (
    "0 1 2 3 4 5 6 7",
    "00 01 02 03 04 05 06 07 10 11 12 13 20 21 22 30 31 40 50 60 70",
    "000 001 002 003 004 005 006 007 010 011 012 020 021 030 040 050 060 070 100 101 110 200 300 400 500",
    "0000 0001 0002 0003 0004 0010 0011 0020 0030 0040 0100 0200 1000 2000 3000",
    "00000 00001 00002 00010 00020 00100 01000 10000",
    "000000 000001 000100",
)
TEMPLATES: dict[str, tuple[Path, ...]] = {
    "recycling-2.2.2": tuple(tuple(int(rank) for rank in node)
                             for level in _RECYCLING_LEVELS for node in level.split()),
}
DEFAULT_TEMPLATE = "recycling-2.2.2"


def template_levels(paths: tuple[Path, ...]) -> list[list[Path]]:
    """The paths of each depth, in the order written."""
    levels: list[list[Path]] = [[] for _ in range(max(len(p) for p in paths))]
    for path in paths:
        levels[len(path) - 1].append(path)
    return levels


@dataclass(frozen=True)
class TemplateTree(VerifySpec, kind="template"):
    """`paths`: a template's name (`recycling-2.2.2`, the default) or its nodes as rank paths,
    every node's parent among them. A node is the mixture's child of that rank at its parent;
    children are ranked, never drawn: a sampled block is verified by SpecExec's rule, and
    greedy replay follows y's ranks down the template. Its depth is the block's gamma."""

    proposer: ClassVar[str] = "pipeline.decoding.draft_template:TemplateTreeProposer"
    paths: str | tuple[Path, ...] = DEFAULT_TEMPLATE

    @property
    def levels(self) -> list[list[Path]]:
        """The rank paths of each depth (a name resolved)."""
        return template_levels(TEMPLATES[self.paths] if isinstance(self.paths, str) else self.paths)

    @property
    def nodes(self) -> tuple[Path, ...]:
        """The rank paths, level by level."""
        return tuple(p for level in self.levels for p in level)

    @property
    def label(self) -> str:
        if isinstance(self.paths, str):
            return f"template({self.paths})"
        digest = hashlib.sha1(json.dumps(self.paths).encode()).hexdigest()[:6]
        return f"template({len(self.paths)}n,{digest})"

    def validate(self) -> None:
        if isinstance(self.paths, str):
            if self.paths not in TEMPLATES:
                raise ValueError(f"unknown tree template {self.paths!r}; known: {', '.join(TEMPLATES)} "
                                 f"(or give the nodes as rank paths, e.g. [[0], [1], [0, 0]])")
            return
        paths = self.paths if isinstance(self.paths, tuple) else ()
        if not paths or len(paths) > MAX_TREE_NODES or not all(
                isinstance(p, tuple) and 1 <= len(p) <= MAX_TREE_DEPTH and all(
                    isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_TOP_K for r in p)
                for p in paths):
            raise ValueError(f"a tree template's paths must be 1 to {MAX_TREE_NODES} lists of ranks from 0 "
                             f"to {MAX_TOP_K - 1}, at most {MAX_TREE_DEPTH} deep, got {self.paths!r}")
        if len(set(paths)) < len(paths):
            raise ValueError("a tree template lists a node twice")
        if orphans := [list(p) for p in paths if len(p) > 1 and p[:-1] not in set(paths)]:
            raise ValueError(f"a tree template's nodes need their parents: {orphans[:3]} have none")

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        return self, len(self.levels)

    def tree_nodes(self, gamma: int, methods: int) -> int:
        return len(self.nodes)

    def draft_rows(self, methods: int) -> int:
        return methods * max([1] + [len(level) for level in self.levels[:-1]])

    def draft_capacity(self, gamma: int) -> int:
        return 1 + sum(len(level) for level in self.levels[:-1])

    def columns(self) -> dict[str, Any]:
        return super().columns() | {"verify_nodes": len(self.nodes)}
