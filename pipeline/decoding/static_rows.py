"""The rows over a transformers `StaticCache` (engine `static`): every step attends over all of
the cache's slots, with masks and positions of aligned rows built once per decode, so decode
steps keep static shapes and on a GPU run as captured CUDA graphs
(`pipeline.models.step_graphs`)."""
from __future__ import annotations

import torch

from pipeline.decoding.rows import DynamicCacheRows
from pipeline.models.base import LVLM, StepLog

CAPACITY_STEP = 256  # static caches come in multiples of this, so compiled steps are reused across samples


class StaticCacheRows(DynamicCacheRows):
    """The same rows over a `StaticCache` of `capacity` continuation slots (rounded up to
    `CAPACITY_STEP`).

    Every step attends over all slots: left padding is masked, and causality hides slots past
    the write position, so stale keys of rejected proposals are never read before they are
    overwritten, and every step of a kind has the same shapes. `compiled` runs the decode steps
    (not the prefill) through the model's compiled forward (on a GPU: captured CUDA graphs).
    `role` names which pooled cache of the model to use, so a target and a draft that are the
    same model never share one.
    """

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], *, capacity: int, compiled: bool, role: str,
                 per_request: int = 1, step_log: StepLog | None = None,
                 positions: list[torch.Tensor | None] | None = None, extras: list | None = None,
                 unseen: list[torch.Tensor | None] | None = None) -> None:
        super().__init__(model, prompts, per_request, step_log, positions, extras, unseen)
        self.slots = -(-(self.width + capacity) // CAPACITY_STEP) * CAPACITY_STEP
        self.cache = model.static_cache(self.rows, self.slots, role)
        self.compiled = compiled
        self._all_keys_open = super()._open_keys(self.slots)  # every step reads all slots
        # every continuation slot's mask row and position ids of aligned rows, built once per
        # decode: a step slices them instead of launching a handful of small kernels
        continuation = self.slots - self.width
        # [rows, 1, continuation, slots]
        self._mask_rows = super()._attention_mask(start=self.width, n=continuation)
        self._position_rows = self._next_position[:, None] + torch.arange(continuation, device=model.device)

    def _open_keys(self, keys: int) -> torch.Tensor:
        return self._all_keys_open

    def _mask(self, n: int) -> torch.Tensor:
        end = self.width + self.fed + n
        if end > self.slots:
            raise ValueError(f"static cache of {self.slots} slots is full: tokens up to slot {end} were fed")
        return super()._mask(n)

    def _attention_mask(self, start: int, n: int) -> torch.Tensor:
        if start < self.width:  # the prefill
            return super()._attention_mask(start, n)
        # contiguous: every step of a kind passes the compiled forward the same strides
        return self._mask_rows[:, :, start - self.width : start - self.width + n].contiguous()

    def _positions(self, n: int, start: int | None = None) -> torch.Tensor:
        start = self.fed if start is None else start
        if not self.aligned:
            return super()._positions(n, start)
        return self._position_rows[:, start : start + n].contiguous()

    def _key_slots(self, end: int) -> int:
        return self.slots

    def _rewind(self, length: int) -> None:
        self.model.rewind_static_cache(self.cache, self.width + length)

    def _forward(self, mask: torch.Tensor, positions: torch.Tensor, *, keep: int, step: bool,
                 hidden: tuple[int, ...] = (), **inputs) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not (self.compiled and step):
            return super()._forward(mask, positions, keep=keep, step=step, hidden=hidden, **inputs)
        return self.model.logits(cache=self.cache, attention_mask=mask, position_ids=positions, keep=keep,
                                 compiled=True, steps=self.step_log, hidden=hidden, **inputs)
