"""Greedy trace replay of a draft-free drafter: no draft distributions to trace, only the token
context it sees. A lookup's chain is the plan it makes at a block's start, over the prompt and
the output so far (`pipeline.decoding.lookup_rows`): the block starting at t accepts the plan's
leading tokens that equal y's, and its plan ends its proposals (a lookup alone never mixes). So
the replayed block is live's exactly, for any gamma, from the prompt's ids and y alone."""
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

    def rule(self, gamma: int, y: list[int]) -> LookupRule:
        return LookupRule(gamma, self, y)


class LookupRule:
    """A replay rule (`pipeline.decoding.draft.StaticRule`'s verbs) for a lookup's chain; its
    index grows with y as the blocks go, once."""

    arm = None

    def __init__(self, gamma: int, trace: LookupTrace, y: list[int]) -> None:
        self.gamma, self._y = gamma, y
        self._lookup = trace.new_lookup()
        self._lookup.extend(trace.context)
        self._indexed = 0  # tokens of y the index holds

    def accepted(self, q: torch.Tensor, y: list[int], t: int, gamma: int, mixing: torch.Tensor) -> int:
        self._lookup.extend(y[self._indexed : t])
        self._indexed = t
        accepted = 0
        for token in self._lookup.propose()[:gamma]:
            if token < 0 or t + accepted >= len(y) or token != y[t + accepted]:
                break
            accepted += 1
        return accepted

    def observe(self, accepted: int) -> None:
        """A chain learns nothing from a block."""
