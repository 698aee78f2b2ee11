"""EAGLE-2's dynamic tree as a verify kind (torch-free, like every kind; its proposer is
`pipeline.decoding.draft_eagle2`). A kind for every drafter: head drafts use it as EAGLE-2 does,
separate and state-space drafts rank their mixture the same way."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from pipeline.decoding.tree_shapes import MAX_TREE_DEPTH, MAX_TREE_NODES
from pipeline.decoding.verify_kinds import MAX_TOP_K, VerifySpec

# EAGLE's own defaults (`EaModel.from_pretrained`); MMSpec runs depth 3, top_k 8, total_tokens 30
EAGLE_DEPTH, EAGLE_TOP_K, EAGLE_TOTAL_TOKENS = 7, 10, 60


@dataclass(frozen=True)
class Eagle2Tree(VerifySpec, kind="eagle2"):
    """From the root, its `top_k` most probable children; then `depth` times, the `top_k` nodes
    of the newest level with the highest path log-probability are read by the draft and each
    gets its own `top_k` children (`top_k`^2 candidates a level). The tree is the
    `total_tokens - 1` candidates of every level with the highest path log-probability
    (`total_tokens` counts the root, as EAGLE's code does), parents before children; a block
    drafts `depth + 1` levels, its gamma. Children are ranked, never drawn: a sampled block is
    verified by SpecExec's rule. The draft never reads a candidate outside a level's top `top_k`,
    so the TABED history, which needs the draft's distribution after every accepted node, has
    nothing to learn from below one: learning weight policies are refused with it."""

    replayable: ClassVar[bool] = False
    proposer: ClassVar[str] = "pipeline.decoding.draft_eagle2:Eagle2TreeProposer"
    depth: int = EAGLE_DEPTH
    top_k: int = EAGLE_TOP_K
    total_tokens: int = EAGLE_TOTAL_TOKENS

    @property
    def label(self) -> str:
        return f"eagle2(d={self.depth},k={self.top_k},n={self.total_tokens})"

    def validate(self) -> None:
        bounds = {"depth": MAX_TREE_DEPTH - 1, "top_k": MAX_TOP_K, "total_tokens": MAX_TREE_NODES + 1}
        for name, most in bounds.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ValueError(f"an eagle2 tree's {name} must be an integer from 1 to {most}, "
                                 f"got {value!r}")
        candidates = self.top_k + self.depth * self.top_k ** 2
        if not 2 <= self.total_tokens <= candidates + 1:
            raise ValueError(f"an eagle2 tree's total_tokens (the root counted) must be from 2 to the "
                             f"{candidates + 1} its depth and top_k generate, got {self.total_tokens}")

    def check_gamma(self, gamma: int) -> None:
        if gamma != self.depth + 1:
            raise ValueError(f"an eagle2 tree of depth {self.depth} drafts {self.depth + 1} levels: gamma "
                             f"{self.depth + 1}, not {gamma} (a grid sets gamma from depth)")

    def check_policy(self, learns: bool) -> None:
        if learns:
            raise ValueError("an eagle2 tree never reads the draft below most of its candidates, where a "
                             "learning weight policy's history would read it: use a static policy or a "
                             "dynamic tree")

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        return self, self.depth + 1

    def tree_nodes(self, gamma: int, methods: int) -> int:
        return self.total_tokens - 1

    def draft_rows(self, methods: int) -> int:
        return methods * self.top_k

    def draft_capacity(self, gamma: int) -> int:
        return self.depth * self.top_k

    def key_fields(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def columns(self) -> dict[str, Any]:
        return super().columns() | {"verify_nodes": self.total_tokens - 1, "verify_top_k": self.top_k,
                                    "verify_knobs": json.dumps(asdict(self), sort_keys=True)}
