"""What transformers' prompt lookup (`pld`) and vLLM's n-gram proposer (`ngram`) share: both
propose the tokens that followed the FIRST occurrence of the context's longest suffix n-gram (its
size n in [lo, hi]) that occurs other than as that suffix, up to k of them and no further than the
context's end. An index of each n-gram's first start answers that without scanning the context."""
from __future__ import annotations

from abc import abstractmethod
from typing import Sequence

from pipeline.lookups.base import Lookup


class FirstNgramLookup(Lookup):
    """`_first[ngram]` is where that n-gram (of a size in [lo, hi], wholly inside the committed
    context) first starts; the first start never moves as the context grows, so extending costs
    hi - lo + 1 dictionary updates a token. A proposal looks up hi - lo + 1 suffix n-grams, and
    scans only the few windows that reach into an uncommitted suffix."""

    def __init__(self, **params: int) -> None:
        super().__init__(**params)
        self._lo, self._hi, self._k = self._bounds()
        self._tokens: list[int] = []
        self._first: dict[tuple[int, ...], int] = {}

    @abstractmethod
    def _bounds(self) -> tuple[int, int, int]:
        """(least n-gram size, largest n-gram size, most tokens proposed) from the kind's params."""

    @property
    def max_tokens(self) -> int:
        return self._k

    def extend(self, tokens: Sequence[int]) -> None:
        context, first = self._tokens, self._first
        for token in tokens:
            context.append(int(token))
            end = len(context)
            for n in range(self._lo, min(self._hi, end) + 1):
                first.setdefault(tuple(context[end - n:]), end - n)

    def propose(self, suffix: Sequence[int] = ()) -> list[int]:
        extra = [int(token) for token in suffix]
        size = len(self._tokens)
        total = size + len(extra)
        for n in range(min(self._hi, total - 1), self._lo - 1, -1):
            ngram = tuple(self._span(extra, total - n, total))
            start = self._first.get(ngram)
            if start is None or start + n == total:  # no committed start but the suffix itself
                # the windows reaching into `extra`, all but the suffix itself
                start = next((i for i in range(max(size - n + 1, 0), total - n)
                              if tuple(self._span(extra, i, i + n)) == ngram), None)
            if start is not None:
                return self._span(extra, start + n, min(start + n + self._k, total))
        return []

    def _span(self, extra: list[int], start: int, end: int) -> list[int]:
        """Tokens [start, end) of the committed context followed by `extra`."""
        size = len(self._tokens)
        if end <= size:
            return self._tokens[start:end]
        return self._tokens[start:size] + extra[max(start - size, 0):end - size]
