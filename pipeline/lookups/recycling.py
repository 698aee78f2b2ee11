"""`recycling`: Token Recycling (Luo et al., ACL 2025, arXiv 2408.08696; Luowaterbi/TokenRecycling),
the draft-free drafter that recycles the target's own candidates: an adjacency matrix holds, for
each token, the `output_topk` tokens the target ranked highest right after it when it last
verified that token. A draft is read off the matrix from the context's last token: the next
token's candidates are that token's row, in rank order, and a tree kind grows the draft from
them level by level (the reference's own tree is the verify kind `{kind: template}`, its
"2.2.2" template). After every verification each token the target read (every node of a tree,
accepted or not) has its row overwritten with the target's top tokens there, so the matrix
learns from what the target just computed and is never trained.

It ranks (a row's tokens weigh output_topk, output_topk - 1, ..., 1) and it observes the
target (`observes`), so it decodes live: its matrix depends on what each block verified, which
no trace replays. Default `output_topk` 8, the reference's `output-id-topk` and MMSpec's
`matrix_top_k`. `shared` 0 (the default) gives each request its own matrix, so a request drafts
what it drafts alone and in any order; `shared=1` is the reference's evaluation, one matrix
carried across every request the drafter decodes (on one actor, in the order they come, so a
figure depends on what ran before it). Not reproduced: the reference's matrix starts as rows of
token 0; here a token has no row until the target has verified it, and a context whose last
token has none proposes nothing.
"""
from __future__ import annotations

from typing import ClassVar, Sequence

from pipeline.lookups.base import Lookup


class RecyclingLookup(Lookup):
    """`_rows[token]`: the target's top tokens after `token`, when it last verified it."""

    kind: ClassVar[str] = "recycling"
    ranks = True
    observes = True
    PARAMS: ClassVar[dict[str, tuple[int, int]]] = {"output_topk": (8, 1), "shared": (0, 0)}

    def __init__(self, memory: dict[int, tuple[int, ...]] | None = None, **params: int) -> None:
        super().__init__(**params)
        self._rows: dict[int, tuple[int, ...]] = {} if memory is None else memory
        self._last: int | None = None

    @classmethod
    def _complete(cls, given: dict[str, int]) -> dict[str, int]:
        if given.get("shared", 0) > 1:
            raise ValueError(f"recycling lookup: shared must be 0 (a matrix per request) or 1 (one matrix "
                             f"across requests), got {given['shared']}")
        return super()._complete(given)

    @classmethod
    def new_memory(cls, params: dict[str, int]) -> dict[int, tuple[int, ...]] | None:
        """One matrix for every request of a drafter when `shared`, else None (a matrix each)."""
        return {} if params.get("shared") else None

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
