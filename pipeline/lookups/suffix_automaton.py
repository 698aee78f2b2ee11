"""`sam`: SAM-Decoding's dynamic suffix automaton (arXiv 2411.10666; hyx1999/SAM-Decoding,
samd/sam/dyn_sam.py `DynSAM` with samd/draft.py's `len_threshold` test), over the context alone.

SAM-Decoding indexes every token but the newest (the token just sampled, its draft's root) and
matches the newest one through it, so with context + suffix as the sequence here:
- the match is the longest suffix of the sequence that occurs ending before its last token (kept
  as (state, length) for the committed context, updated in amortised O(1) a token by the standard
  online matching), and nothing is proposed when its length is below `len_threshold`;
- each state keeps the FIRST end position of its strings (DynSAM's `min_endpos`; a clone takes its
  original's), so a match always has an earlier occurrence and a real continuation;
- DynSAM's `to_anc`: while fewer than `n_predicts` tokens follow that first end before the last
  token, and the state's suffix link is not the root, step along the link to a shorter suffix (it
  may fall below `len_threshold`: SAM-Decoding tests the threshold on the match alone);
- the draft is what followed the first end: `n_predicts` counts the root, so up to n_predicts - 1
  tokens, taken before the sequence's last token (DynSAM reads its index's tokens, never the root).
Defaults as SamdConfig and the Spec-Bench run script (scripts/inference_samd.sh): n_predicts 40,
len_threshold 5. Not reproduced: the static SAM over a corpus and the tree drafter SAM-Decoding
falls back to (drafters of their own), and the zero padding of a draft to a fixed length.
"""
from __future__ import annotations

from typing import Any, ClassVar, MutableSequence, Sequence

from pipeline.lookups.base import Lookup


class SuffixAutomatonLookup(Lookup):
    """State 0 is the root (the empty string); `_next`, `_link`, `_len` and `_first` (the end index
    of a state's first occurrence) are per state. A proposal after a suffix extends the automaton
    by it and undoes the change (a log of what it overwrote), so it never copies the index; it costs
    what that extension does, unamortised: a token breaking a long run of one repeated token walks
    the run's suffix links each time (DynSAM's own lookup does too)."""

    kind: ClassVar[str] = "sam"
    PARAMS: ClassVar[dict[str, tuple[int, int]]] = {
        "n_predicts": (40, 2),  # the root and at least one token
        "len_threshold": (5, 1),  # a match of length 0 is no match
    }

    def __init__(self, **params: int) -> None:
        super().__init__(**params)
        self._tokens: list[int] = []
        self._next: list[dict[int, int]] = [{}]
        self._link = [-1]
        self._len = [0]
        self._first = [-1]
        self._last = 0  # the state of the whole context
        self._match = (0, 0)  # (state, length) of the match
        # while a proposal extends: (dict or list, key, old value or None where there was none)
        self._undo: list[tuple[Any, int, int | None]] | None = None

    @property
    def max_tokens(self) -> int:
        return self.params["n_predicts"] - 1

    @property
    def match_length(self) -> int:
        """The length of the committed context's longest suffix occurring before its last token."""
        return self._match[1]

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self._add(int(token))

    def propose(self, suffix: Sequence[int] = ()) -> list[int]:
        if not suffix:
            return self._draft()
        mark = len(self._tokens), len(self._len), self._last, self._match
        self._undo = []
        try:
            self.extend(suffix)
            return self._draft()
        finally:
            for row, key, old in reversed(self._undo):
                if old is None:
                    del row[key]
                else:
                    row[key] = old
            self._undo = None
            size, states, self._last, self._match = mark
            del self._tokens[size:]
            for per_state in (self._next, self._link, self._len, self._first):
                del per_state[states:]

    def _draft(self) -> list[int]:
        """DynSAM's `to_anc` and `gen_draft` from the match, its root being the last token."""
        state, length = self._match
        if length < self.params["len_threshold"]:
            return []
        n_predicts, root = self.params["n_predicts"], len(self._tokens) - 1
        while self._link[state] != 0 and root - 1 - self._first[state] < n_predicts:
            state = self._link[state]
        start = self._first[state] + 1
        return self._tokens[start:min(start + n_predicts - 1, root)]

    def _add(self, token: int) -> None:
        """Match `token` in the automaton without it, then the online construction's step."""
        nxt, link, lens = self._next, self._link, self._len
        state, length = self._match
        while state and token not in nxt[state]:
            state = link[state]
            length = lens[state]
        state, length = (nxt[state][token], length + 1) if token in nxt[state] else (0, 0)
        cur = self._new(lens[self._last] + 1, len(self._tokens), {})
        self._tokens.append(token)
        p = self._last
        while p != -1 and token not in nxt[p]:
            self._set(nxt[p], token, cur)
            p = link[p]
        if p == -1:
            link[cur] = 0
        elif lens[p] + 1 == lens[nxt[p][token]]:
            link[cur] = nxt[p][token]
        else:
            q = nxt[p][token]
            clone = self._new(lens[p] + 1, self._first[q], dict(nxt[q]), link[q])
            while p != -1 and nxt[p].get(token) == q:
                self._set(nxt[p], token, clone)
                p = link[p]
            self._set(link, q, clone)
            link[cur] = clone
        self._last = cur
        self._match = (state, length)

    def _new(self, length: int, first: int, nxt: dict[int, int], link: int = -1) -> int:
        self._next.append(nxt)
        self._link.append(link)
        self._len.append(length)
        self._first.append(first)
        return len(self._len) - 1

    def _set(self, row: dict[int, int] | MutableSequence[int], key: int, value: int) -> None:
        """A transition or link, logged (what it overwrote) while a proposal extends."""
        if self._undo is not None:
            self._undo.append((row, key, row.get(key) if isinstance(row, dict) else row[key]))
        row[key] = value
