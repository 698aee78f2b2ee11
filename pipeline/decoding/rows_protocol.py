"""What proposers, verification, replay's traces and calibration ask of a batch of rows, the
drafter seam: the verbs that feed and roll back, defined once. Each kind of drafter implements
them (`pipeline.decoding.rows`' KV rows, `state_rows`, `head_rows`, `lookup_rows`), and `engine.DRAFTERS`
builds the kind a model names (`LVLM.drafter`)."""
from __future__ import annotations

from typing import Protocol

import torch

from pipeline.models.base import LVLM, StepLog


class Rows(Protocol):
    """What proposers, verification, replay's traces and calibration ask of a batch of rows:
    the verbs that feed and roll back, defined once. `engine.new_rows` picks the class from the
    model (KV rows, or a state-space model's `StateRows`)."""

    model: LVLM
    rows: int  # rows in the batch
    per_request: int  # rows of one request (request-major)
    step_log: StepLog
    # settling keeps only what was read with the target's states, and the next block reads the
    # accepted proposals again with them (`Pending.after`): a head's rows
    rereads_kept: bool
    # rows that may propose nothing at a position (a lookup without a match; absent or None for
    # the others): after each feed, `[rows, keep]` True where a row abstained, its distribution
    # uniform; a chain ends where every row of a request abstains (`ChainProposal.depths`)
    abstains: torch.Tensor | None

    def prefill(self, hidden: tuple[int, ...] = ()) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the prompts once; fp32 logits after each row's last prompt token `[rows, 1, V]`
        (and, `hidden`, those hidden states at every prompt slot: `LVLM.logits`)."""

    def feed(self, token_ids: torch.Tensor | list[int], keep: int = 1, valid: list[int] | None = None,
             hidden: tuple[int, ...] = (),
             features: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append tokens to every row (`[n]`) or each row its own (`[rows, n]`); `valid` (a block's
        first feed only): row r's last `valid[r]` tokens are real, the others fillers. fp32 logits
        of the last `keep` `[rows, keep, V]` (and, `hidden`, those hidden states at every token
        fed: `LVLM.logits`). `features`: the target's states before each token (`[rows, n, F]`),
        which rows that read the target (a head's) take with the tokens; others ignore them."""

    def begin_tree(self) -> None:
        """The next tree feeds form a tree rooted at the last token fed."""

    def feed_level(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """A draft tree's next level: each request's `[B, W]` nodes, children of the level above's
        nodes `parents` (`[B, W]`; the root for the first level); fp32 logits of every node for
        each of the request's rows `[B, W, per_request, V]`."""

    def settle(self, keep: list[int], order: torch.Tensor | None = None) -> None:
        """Row r keeps `keep[r]` tokens of the block: its first real ones, or those at block
        positions `order[r]` (`[rows, span]`), in that order; the rest is dropped."""

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        """Give every one of `groups` equal groups of each request's rows the block of its group
        `source[b]` (`[B]`) from block position `start` on."""
