"""`recycling`: Token Recycling (Luo et al., ACL 2025, arXiv 2408.08696; Luowaterbi/TokenRecycling),
the draft-free drafter that recycles the target's own candidates: an adjacency matrix holds, for
each token, the `output_topk` tokens the target ranked highest right after it when it last
verified that token. A draft is read off the matrix from the context's last token: the next
token's candidates are that token's row, in rank order, and a tree kind grows the draft from
them level by level. After every verification each token the target read (every node of a
tree, accepted or not) has its row overwritten with the target's top tokens there, so the matrix
learns from what the target just computed and is never trained.

It ranks (a row's tokens weigh output_topk, output_topk - 1, ..., 1) and it observes the
target (`observes`), so it decodes live: its matrix depends on what each block verified, which
no trace replays. Default `output_topk` 8, the reference's `output-id-topk` and MMSpec's
`matrix_top_k`. Not reproduced: the reference's fixed "2.2.2" tree template (a grid names the
tree kind, e.g. `{kind: shape, shape: [8, 4, 2, 1]}`), and its matrix's start (rows of zeros;
here a token has no row until the target has verified it, and a context whose last token has
none proposes nothing).
"""
from __future__ import annotations

from typing import ClassVar, Sequence

from pipeline.lookups.base import Lookup


class RecyclingLookup(Lookup):
    """`_rows[token]`: the target's top tokens after `token`, when it last verified it."""

    kind: ClassVar[str] = "recycling"
    ranks = True
    observes = True
    PARAMS: ClassVar[dict[str, tuple[int, int]]] = {"output_topk": (8, 1)}

    def __init__(self, **params: int) -> None:
        super().__init__(**params)
        self._rows: dict[int, tuple[int, ...]] = {}
        self._last: int | None = None

    @property
    def max_tokens(self) -> int:
        return self.params["output_topk"]

    def extend(self, tokens: Sequence[int]) -> None:
        if len(tokens):
            self._last = int(tokens[-1])

    def observe(self, token: int, top: Sequence[int]) -> None:
        self._rows[int(token)] = tuple(int(t) for t in top[: self.params["output_topk"]])

    def counts(self, suffix: Sequence[int] = ()) -> dict[int, int]:
        last = int(suffix[-1]) if len(suffix) else self._last
        row = self._rows.get(last, ()) if last is not None else ()
        return {token: len(row) - rank for rank, token in enumerate(row) if token >= 0}

    def propose(self, suffix: Sequence[int] = ()) -> list[int]:
        """The matrix's greedy chain: each token's first candidate, from the context's last token."""
        plan: list[int] = []
        while len(plan) < self.max_tokens and (found := self.counts([*suffix, *plan])):
            plan.append(max(found, key=found.get))
        return plan
