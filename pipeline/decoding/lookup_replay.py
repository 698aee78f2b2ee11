"""Greedy trace replay of a draft-free drafter: no draft distributions to trace, only the token
context it sees. A lookup's chain is the plan it makes at a block's start, over the prompt and
the output so far (`pipeline.decoding.lookup_rows`): the block starting at t accepts the plan's
leading tokens that equal y's, and its plan ends its proposals (a lookup alone never mixes). So
the replayed block is live's exactly, for any gamma, from the prompt's ids and y alone.

In an ensemble across drafters (method L beside a draft's) the lookup's distribution at a
block's position depends on where the block began: `LookupColumn` makes it, block by block, as
the live rows would along y (a fresh plan at the block's start, followed while y follows it,
looked up afresh where it does not), and puts it in L's place among the traced distributions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from pipeline.lookups import Lookup


@dataclass(frozen=True)
class LookupTrace:
    """What replay needs of a lookup draft for one sample: the prompt as its rows see it (token
    ids, each image one negative id) and a factory of its empty index."""

    context: list[int]
    new_lookup: Callable[[], Lookup]

    def rule(self, gamma: int) -> LookupRule:
        return LookupRule(gamma, self)

    def indexed(self) -> Indexed:
        return Indexed(self)


class Indexed:
    """The lookup's index over the prompt and y's first `upto` tokens, grown as replay goes on."""

    def __init__(self, trace: LookupTrace) -> None:
        self.lookup = trace.new_lookup()
        self.lookup.extend(trace.context)
        self.upto = 0

    def plan(self, y: list[int], t: int, suffix: list[int] = ()) -> list[int]:
        """The lookup's continuation after the prompt, y[:t] and `suffix`, cut before any image."""
        self.lookup.extend(y[self.upto : t])
        self.upto = max(self.upto, t)
        return self.lookup.plan(list(suffix))


class LookupColumn:
    """L's distributions along y, block by block (one-hot on the plan's token, uniform where it
    has none: the live rows' own), in an ensemble's traced distributions."""

    def __init__(self, trace: LookupTrace) -> None:
        self._index = trace.indexed()

    def block(self, q: torch.Tensor, y: list[int], t: int, depth: int, member: int) -> torch.Tensor:
        """`q` `[n, m, V]` at positions t..t + depth - 1, with L's (column `member`) as the block
        starting at t makes it."""
        rows = q[t : t + depth].clone()
        plan, at = self._index.plan(y, t), 0
        for i in range(rows.shape[0]):
            token = plan[at] if at < len(plan) else None
            rows[i, member] = 1.0 / rows.shape[-1] if token is None else 0.0
            if token is not None:
                rows[i, member, token] = 1.0
            if token == y[t + i]:
                at += 1
            else:
                plan, at = self._index.plan(y, t, y[t : t + i + 1]), 0
        return rows


class LookupRule:
    """A replay rule (`pipeline.decoding.draft.StaticRule`'s verbs) for a lookup's chain; its
    index grows with y as the blocks go, once."""

    arm = None

    def __init__(self, gamma: int, trace: LookupTrace) -> None:
        self.gamma, self._index = gamma, trace.indexed()

    def accepted(self, q: torch.Tensor, y: list[int], t: int, gamma: int, mixing: torch.Tensor) -> int:
        accepted = 0
        for token in self._index.plan(y, t)[:gamma]:
            if t + accepted >= len(y) or token != y[t + accepted]:
                break
            accepted += 1
        return accepted

    def observe(self, accepted: int) -> None:
        """A chain learns nothing from a block."""
