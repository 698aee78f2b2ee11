"""The rule that turns one verified block into output, for live decoding and trace replay alike.

A block proposes `gamma` tokens; the target accepts a prefix of them and adds its own token
(at the first mismatch, or the bonus token after all `gamma`). What is kept, what is
recorded and which positions the TABED history learns from is decided here and nowhere else,
so replay reproduces live runs by construction rather than by keeping two loops equal.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

WEIGHT_DECIMALS = 6  # weights are recorded rounded, identically for live and replayed rows


@dataclass(frozen=True)
class BlockOutcome:
    """`tokens`: appended to the output; `accepted`: the accepted proposals among them (the
    block's contribution to tau); `stop`: generation ended (EOS or budget); `history`: how many
    of the block's positions the history learns from (0 after the last block)."""

    tokens: list[int]
    accepted: int
    stop: bool
    history: int


def settle_block(
    accepted_proposals: Sequence[int],
    next_token: int | None,
    *,
    gamma: int,
    produced: int,
    max_new_tokens: int,
    eos: set[int] | frozenset[int],
) -> BlockOutcome:
    """Cut the block at the first EOS and at the token budget.

    `accepted_proposals` are the proposals the target accepted, `next_token` the target's own
    token after them (None when replay has run out of traced output), `produced` the tokens
    output before this block. History positions are the accepted proposals plus the first
    rejected one, i.e. `min(accepted + 1, gamma)`: exactly the positions where the draft's and
    the target's distributions were both computed from the true prefix (not the bonus position).
    """
    block = list(accepted_proposals) + ([] if next_token is None else [next_token])
    kept = block[: max_new_tokens - produced]
    stop = len(kept) == max_new_tokens - produced
    for i, token in enumerate(kept):
        if token in eos:
            kept, stop = kept[: i + 1], True
            break
    accepted = min(len(accepted_proposals), len(kept))
    return BlockOutcome(kept, accepted, stop, 0 if stop else min(len(accepted_proposals) + 1, gamma))


def recorded_weights(weights: torch.Tensor | Sequence[float]) -> list[float]:
    """The block's ensemble weights as stored in a record."""
    return [round(float(w), WEIGHT_DECIMALS) for w in weights]
