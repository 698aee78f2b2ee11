"""Rows of different prompt lengths decoded as ONE batch with one KV cache (SPEC §3).

Every row continues with the same generated tokens; only the prompts differ (one row per
drafting method). Prompts are left-padded, each row gets its own attention mask and position
ids, and the cache is cropped uniformly because generated tokens sit at the same offsets in
every row. The target uses the same class with a single row.
"""
from __future__ import annotations

import torch

from pipeline.models.base import LVLM


class BatchedRows:
    """A batch of prompt rows plus the shared continuation fed so far.

    `fed` counts how many shared continuation tokens are in the cache; the caller decides
    which of them survive verification with `keep_shared`.
    """

    def __init__(self, model: LVLM, prompts: list[torch.Tensor]) -> None:
        self.model = model
        lengths = torch.tensor([p.shape[0] for p in prompts])
        width = int(lengths.max())
        hidden = prompts[0].shape[-1]
        embeds = prompts[0].new_zeros(len(prompts), width, hidden)
        self.mask = torch.zeros(len(prompts), width, dtype=torch.long, device=model.device)
        for row, prompt in enumerate(prompts):
            embeds[row, width - prompt.shape[0]:] = prompt
            self.mask[row, width - prompt.shape[0]:] = 1
        self._prompt_embeds = embeds
        self._next_position = lengths.to(model.device)  # per row: position of the next token
        self.cache = model.new_cache()
        self.fed = 0

    def prefill(self) -> None:
        """Run the padded prompts once; padded slots get position 0 and are masked out."""
        positions = (self.mask.cumsum(-1) - 1).clamp_min(0)
        self.model.logits(
            cache=self.cache,
            attention_mask=self.mask,
            position_ids=positions,
            inputs_embeds=self._prompt_embeds,
            keep=1,
        )
        self._prompt_embeds = None  # the cache holds them now

    def feed(self, token_ids: list[int], keep: int = 1) -> torch.Tensor:
        """Append the same tokens to every row; fp32 logits of the last `keep`: `[B, keep, V]`."""
        rows, n = self.mask.shape[0], len(token_ids)
        ids = torch.tensor([token_ids] * rows, device=self.model.device)
        offsets = torch.arange(self.fed, self.fed + n, device=self.model.device)
        self.mask = torch.cat([self.mask, self.mask.new_ones(rows, n)], dim=1)
        logits = self.model.logits(
            cache=self.cache,
            attention_mask=self.mask,
            position_ids=self._next_position[:, None] + offsets[None, :],
            input_ids=ids,
            keep=keep,
        )
        self.fed += n
        return logits

    def keep_shared(self, n: int) -> None:
        """Drop every cached continuation token after the first `n` (rejected proposals)."""
        drop = self.fed - n
        if drop < 0:
            raise ValueError(f"cannot keep {n} continuation tokens: only {self.fed} were fed")
        if drop:
            self.cache.crop(-drop)
            self.mask = self.mask[:, : self.mask.shape[1] - drop]
            self.fed = n
