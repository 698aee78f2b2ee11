"""Rows of Medusa's heads: the `Rows` verbs over a drafter that keeps nothing. At a block's first
feed every head reads the target's state before the last pending token (`Pending.features`);
the block's i-th draft step (a chain's token, a tree's level) is head i's prediction, whatever
was proposed before it, the last head's past the K heads. Nothing is cached, so rolling back is
nothing, and every block starts again from the target's state (`rereads_kept`)."""
from __future__ import annotations

import torch

from pipeline.models.base import LVLM, StepLog


class MedusaRows:
    rereads_kept = True

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], *, per_request: int = 1,
                 step_log: StepLog | None = None, **unused: object) -> None:
        self.model, self.rows, self.per_request = model, len(prompts), per_request
        self.step_log = StepLog() if step_log is None else step_log
        self._logits: torch.Tensor | None = None  # [rows, K, V]: every head's, this block
        self._step = 0  # the head the next draft step reads

    def prefill(self, hidden: tuple[int, ...] = ()) -> torch.Tensor:
        """Nothing to read: the heads wait for the target's state at the first block."""
        return torch.zeros(self.rows, 1, self.model.tokenizer.vocab_size, device=self.model.device)

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1, valid: list[int] | None = None,
             hidden: tuple[int, ...] = (), features: torch.Tensor | None = None) -> torch.Tensor:
        """A block's first feed (with `features`): every head reads the state before its last token,
        and head 0's logits come back; a later one-token feed: the next head's. `[rows, 1, V]`."""
        if features is not None or self._logits is None:  # no state yet: calibration times zeros
            states = features[:, -1] if features is not None else torch.zeros(
                self.rows, self.model.model[0][-1].in_features, device=self.model.device)
            self._logits, self._step = self.model.head_logits(states), 0
            self.step_log.modes.add("uncompiled")
        return self._next()[:, None]

    def _next(self) -> torch.Tensor:
        logits = self._logits[:, min(self._step, self._logits.shape[1] - 1)]
        self._step += 1
        return logits

    def begin_tree(self) -> None:
        """A tree's level d is head d's prediction for every node of it."""

    def feed_level(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        logits = self._next().view(-1, self.per_request, self._logits.shape[-1])
        return logits[:, None].expand(-1, tokens.shape[1], -1, -1)

    def settle(self, keep: list[int], order: torch.Tensor | None = None) -> None:
        """Nothing was kept, nothing to drop."""

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        """Every row of a request predicts the same: nothing to copy."""
