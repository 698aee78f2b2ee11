"""Rows of an ensemble across drafters (`pipeline.models.mixed_draft`): each request's rows are
its drafting methods in order, some the draft model's (a KV cache or a state each), L's the
lookup's (`lookup_rows`). Every verb splits the batch's rows between the two kinds and puts the
answers back in row order, so a proposer sees one batch of rows, as it does for one drafter.

Beside a head, whose rows keep only what they read with the target's states and so read a
block's accepted proposals again at the next block's start (`rereads_kept`), the lookup's rows
keep only the tokens a block began with too, and read the accepted ones again with the head."""
from __future__ import annotations

import torch

from pipeline.decoding.rows_protocol import Rows


class MixedRows:
    """`parts`: (rows of one drafter, the batch rows they hold, in order); `per_request`: rows
    per request across both."""

    def __init__(self, parts: list[tuple[Rows, list[int]]], per_request: int) -> None:
        self.parts, self.per_request = parts, per_request
        self.rows = sum(len(index) for _, index in parts)
        self.step_log = parts[0][0].step_log
        self.rereads_kept = any(rows.rereads_kept for rows, _ in parts)
        self.abstains: torch.Tensor | None = None
        self._began = [0] * self.rows  # tokens each row's block began with (kept alone, on a reread)

    def prefill(self, hidden: tuple[int, ...] = ()) -> torch.Tensor:
        return self._merged([rows.prefill() for rows, _ in self.parts], 0)

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1, valid: list[int] | None = None,
             hidden: tuple[int, ...] = (), features: torch.Tensor | None = None) -> torch.Tensor:
        ids = torch.as_tensor(token_ids)
        if features is not None:  # a block's first feed
            self._began = list(valid) if valid is not None else [ids.shape[-1]] * self.rows
        outs = []
        for rows, index in self.parts:
            at = torch.tensor(index, device=ids.device)
            mine = ids if ids.dim() < 2 else ids[at]
            own = None if valid is None else [valid[r] for r in index]
            read = features[at.to(features.device)] if features is not None and rows.rereads_kept else None
            outs.append(rows.feed(mine, keep=keep, valid=own, features=read))
        return self._merged(outs, 0)

    def begin_tree(self) -> None:
        for rows, _ in self.parts:
            rows.begin_tree()

    def feed_level(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Each part answers `[B, W, its rows per request, V]`; merged along the request's rows."""
        outs = [rows.feed_level(tokens, parents) for rows, _ in self.parts]
        return self._merged(outs, 2)

    def settle(self, keep: list[int], order: torch.Tensor | None = None) -> None:
        rereads = [self.rereads_kept and not rows.rereads_kept for rows, _ in self.parts]
        for (rows, index), reread in zip(self.parts, rereads):
            rows.settle([min(keep[r], self._began[r]) if reread else keep[r] for r in index],
                        None if order is None else order[torch.tensor(index, device=order.device)])
        self._began = [0] * self.rows

    def observe_target(self, fed: torch.Tensor, top: torch.Tensor) -> None:
        for rows, _ in self.parts:
            if hasattr(rows, "observe_target"):
                rows.observe_target(fed, top)

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        for rows, _ in self.parts:
            rows.copy_rows(groups, source, start)

    def _merged(self, outs: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The parts' answers in the batch's row order (dim 0: rows; dim 2: a request's rows), and
        where each row abstained (a model's rows never do)."""
        per = self.per_request
        shape = list(outs[0].shape)
        shape[dim] = self.rows if dim == 0 else per
        merged = outs[0].new_empty(shape)
        abstains = torch.zeros(shape[:-1], dtype=torch.bool, device=merged.device)
        for (rows, index), out in zip(self.parts, outs):
            at = torch.tensor(index if dim == 0 else [r for r in index if r < per], device=merged.device)
            merged.index_copy_(dim, at, out)
            mine = getattr(rows, "abstains", None)
            if mine is not None:
                abstains.index_copy_(dim, at, mine.to(abstains.device))
        self.abstains = abstains
        return merged
