"""Prompt rows decoded as ONE batch over one KV cache: the target's single row and the draft's
rows, one per drafting method (docs/algorithm.md §3).

Rows share the tokens fed after their prompts (the continuation); only the prompts differ.
Prompts are left-padded, each row gets its own position ids and its own 4-D attention mask
(padding and causality, built here on the device: transformers uses a prepared mask as it
is, where building one itself would read the mask back to the host), and every continuation
token sits at the same cache slot in every row, so dropping rejected proposals is one
operation for the whole batch. Beyond chains:
- `feed` takes per-row tokens (`[rows, n]`): a candidate tree drafts each branch in its own rows;
- `feed_tree` feeds tokens that see only their ancestors among the tree fed since `begin_tree`,
  at positions root + depth: a token tree verified or drafted in one forward;
- `keep_path` moves an accepted path's cache entries up to follow the prefix, and `copy_rows`
  gives every group of rows one group's continuation, both in place on the device.

Two cache strategies, chosen by the engine (`pipeline.decoding.engine`):
- `DynamicCacheRows` (engine `eager`): transformers' `DynamicCache`, grown by concatenation
  and cropped after each block.
- `StaticCacheRows` (engine `static`): transformers' `StaticCache`, allocated once for the
  whole sample with a fixed-shape mask; rejecting proposals only moves the write position back,
  and decode steps have static shapes, so on a GPU they run as captured CUDA graphs.
"""
from __future__ import annotations

from typing import Protocol

import torch

from pipeline.models.base import LVLM, StepLog

CAPACITY_STEP = 256  # static caches come in multiples of this, so compiled steps are reused across samples


class Rows(Protocol):
    """What proposers, verification, replay and calibration ask of a batch of prompt rows: the
    verbs that feed and roll back, defined once. KV rows (`DynamicCacheRows`,
    `StaticCacheRows`) do all of them; a state-space draft's rows
    (`pipeline.decoding.state_rows.StateRows`) all but the tree verbs. `engine.new_rows` picks
    the class from the model."""

    model: LVLM
    rows: int  # prompt rows in the batch
    fed: int  # continuation tokens fed so far
    tree_start: int  # where the tree being fed began (`begin_tree`)
    step_log: StepLog

    def prefill(self) -> None:
        """Run the prompts once (their last token is fed later, as the first continuation token)."""

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1) -> torch.Tensor:
        """Append tokens to every row (`[n]`) or each row its own (`[rows, n]`); fp32 logits of the
        last `keep`."""

    def keep_shared(self, n: int) -> None:
        """Roll back to the first `n` continuation tokens."""

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        """Give every group of rows group `source`'s continuation from slot `start` on."""

    def begin_tree(self) -> None:
        """The next `feed_tree` tokens form a tree rooted at the last token fed."""

    def feed_tree(self, token_ids: torch.Tensor, offsets: torch.Tensor, sees: torch.Tensor,
                  keep: int) -> torch.Tensor:
        """Append a tree's tokens in one forward, each seeing only its ancestors."""

    def keep_path(self, slots: torch.Tensor, first: int) -> None:
        """Move an accepted path's continuation up to follow slot `first`."""


def left_padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt embeddings `[L_i, hidden]` as one left-padded batch `[B, width, hidden]`, and
    `[B, width]` bool, False where a row is padding."""
    width = max(p.shape[0] for p in prompts)
    embeds = prompts[0].new_zeros(len(prompts), width, prompts[0].shape[-1])
    padding = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        embeds[row, width - prompt.shape[0]:] = prompt
        padding[row, width - prompt.shape[0]:] = True
    return embeds, padding


class DynamicCacheRows:
    """A batch of prompt rows plus the continuation fed so far (DynamicCache).

    `fed` counts the continuation tokens in the cache; the caller decides which survive
    verification with `keep_shared`. `step_log` collects how the decode steps ran (shared by a
    decode's target and draft rows).
    """

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], step_log: StepLog | None = None) -> None:
        self.model = model
        self.step_log = StepLog() if step_log is None else step_log
        self.rows = len(prompts)
        self._prompt_embeds, padding = left_padded(prompts)
        self.width = padding.shape[1]
        self._padding = padding.to(model.device)  # [B, width]: False where a row is padded
        # per row: the next position
        self._next_position = torch.tensor([p.shape[0] for p in prompts], device=model.device)
        self.cache = model.new_cache()
        self.fed = 0
        self.tree_start = 0  # the continuation slot where the tree being fed began (`begin_tree`)

    def prefill(self) -> torch.Tensor:
        """Run the padded prompts once; padded slots get position 0 and are masked out. Returns
        the fp32 logits after each row's last prompt token, `[B, 1, V]`."""
        positions = (self._padding.long().cumsum(-1) - 1).clamp_min(0)
        mask = self._attention_mask(start=0, n=self.width)
        logits = self._forward(mask, positions, keep=1, inputs_embeds=self._prompt_embeds, step=False)
        self._prompt_embeds = None  # the cache holds them now
        return logits

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1) -> torch.Tensor:
        """Append tokens to every row (`[n]`: the same in each; `[rows, n]`: each row its own);
        fp32 logits of the last `keep`: `[B, keep, V]`. `token_ids` may be a device tensor (the
        engine's proposals never leave the device)."""
        ids = torch.as_tensor(token_ids, device=self.model.device)
        ids = ids.view(1, -1).expand(self.rows, -1) if ids.dim() < 2 else ids
        n = ids.shape[1]
        mask, positions = self._step_mask(n), self._step_positions(n)
        logits = self._forward(mask, positions, keep=keep, input_ids=ids, step=True)
        self.fed += n
        return logits

    def begin_tree(self) -> None:
        """The next `feed_tree` tokens form a tree whose root is the last token fed so far."""
        self.tree_start = self.fed

    def feed_tree(self, token_ids: torch.Tensor, offsets: torch.Tensor, sees: torch.Tensor,
                  keep: int) -> torch.Tensor:
        """Append `n` tokens of a tree to every row: token i at the position a chain token fed
        at the tree's first slot would have, plus `offsets[i]` (its depth below that slot's
        token), seeing the prefix before the tree and, within the tree fed since `begin_tree`,
        what `sees[i]` allows (`[n, tree so far + n]` bool); fp32 logits of the last `keep`:
        `[B, keep, V]`. Shapes are fixed for a tree kind, so compiled steps are reused."""
        ids = token_ids.view(1, -1).expand(self.rows, -1)
        n = ids.shape[1]
        mask = self._step_mask(n).clone()
        first, end = self.width + self.tree_start, self.width + self.fed + n
        blocked = torch.finfo(mask.dtype).min
        tree = torch.zeros(sees.shape, dtype=mask.dtype, device=mask.device).masked_fill_(~sees, blocked)
        mask[:, :, :, first:end] = tree
        positions = self._next_position[:, None] + self.tree_start + offsets[None, :]
        logits = self._forward(mask, positions, keep=keep, input_ids=ids, step=True)
        self.fed += n
        return logits

    def keep_path(self, slots: torch.Tensor, first: int) -> None:
        """Move the cache entries of continuation slots `slots` (`[k]`, a device tensor) to
        slots `first, first + 1, ...` in every row and layer: an accepted path of a tree then
        follows the prefix as a chain would. Entries left behind are dropped by `keep_shared`."""
        source = self.width + slots
        target = self.width + first + torch.arange(slots.shape[0], device=slots.device)
        for layer in self.cache.layers:
            for states in (layer.keys, layer.values):
                states.index_copy_(2, target, states.index_select(2, source))

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        """Give every one of `groups` equal groups of rows the continuation of group `source`
        (0-d device tensor) from continuation slot `start` on: after a candidate tree, every
        branch's rows continue the accepted branch. Rows of several requests (request-major,
        `pipeline.decoding.ragged_rows`) take `source` `[requests]`: each request's own group."""
        first, end = self.width + start, self.width + self.fed
        sources = source.view(-1)
        for layer in self.cache.layers:
            for states in (layer.keys, layer.values):
                grouped = states.view(sources.shape[0], groups, -1, *states.shape[1:])[..., first:end, :]
                index = sources.view(-1, 1, 1, 1, 1, 1).expand(-1, 1, *grouped.shape[2:])
                grouped.copy_(grouped.gather(1, index).expand_as(grouped))

    def _step_mask(self, n: int) -> torch.Tensor:
        """The attention mask of the next `n` continuation tokens."""
        return self._attention_mask(start=self.width + self.fed, n=n)

    def _step_positions(self, n: int) -> torch.Tensor:
        """`[B, n]` position ids of the next `n` continuation tokens in every row."""
        offsets = torch.arange(self.fed, self.fed + n, device=self.model.device)
        return self._next_position[:, None] + offsets[None, :]

    def keep_shared(self, n: int) -> None:
        """Drop every cached continuation token after the first `n` (rejected proposals)."""
        drop = self.fed - n
        if drop < 0:
            raise ValueError(f"cannot keep {n} continuation tokens: only {self.fed} were fed")
        if drop:
            self.cache.crop(-drop)
            self.fed = n

    def _key_slots(self, end: int) -> int:
        """How many cache slots the attention reads when the new tokens end at slot `end`."""
        return end

    def _open_keys(self, keys: int) -> torch.Tensor:
        """`[B, keys]`: False for left padding, True for every later slot."""
        open_keys = torch.ones(self.rows, keys, dtype=torch.bool, device=self._padding.device)
        open_keys[:, : self.width] = self._padding
        return open_keys

    def _attention_mask(self, start: int, n: int) -> torch.Tensor:
        """Additive mask `[B, 1, n, keys]` for `n` new tokens written from cache slot `start`:
        a key is visible if it is not padding and not after the query."""
        keys = self._key_slots(start + n)
        device = self._padding.device
        slots, positions = torch.arange(keys, device=device), torch.arange(start, start + n, device=device)
        causal = slots[None, :] <= positions[:, None]
        visible = self._open_keys(keys)[:, None, None, :] & causal[None, None]
        blocked = torch.finfo(self.model.dtype).min
        mask = torch.zeros(visible.shape, dtype=self.model.dtype, device=device)
        return mask.masked_fill_(~visible, blocked)

    def _forward(self, mask: torch.Tensor, positions: torch.Tensor, *, keep: int, step: bool,
                 **inputs) -> torch.Tensor:
        if step:
            self.step_log.modes.add("uncompiled")
        return self.model.logits(cache=self.cache, attention_mask=mask, position_ids=positions, keep=keep,
                                 **inputs)


class StaticCacheRows(DynamicCacheRows):
    """The same rows over a `StaticCache` of `capacity` slots (rounded up to `CAPACITY_STEP`).

    Every step attends over all slots: left padding is masked, and causality hides slots past
    the write position, so stale keys of rejected proposals are never read before they are
    overwritten, and every step of a kind has the same shapes. `compiled` runs the decode steps
    (not the prefill) through the model's compiled forward (on a GPU: captured CUDA graphs).
    `role` names which pooled cache of the model to use, so a target and a draft that are the
    same model never share one.
    """

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], *, capacity: int, compiled: bool, role: str,
                 step_log: StepLog | None = None) -> None:
        super().__init__(model, prompts, step_log)
        self.slots = -(-(self.width + capacity) // CAPACITY_STEP) * CAPACITY_STEP
        self.cache = model.static_cache(self.rows, self.slots, role)
        self.compiled = compiled
        self._all_keys_open = super()._open_keys(self.slots)  # every step reads all slots
        # every continuation slot's mask row and position ids, built once per sample: a step
        # slices them instead of launching a handful of small kernels to rebuild them
        continuation = self.slots - self.width
        # [B, 1, continuation, slots]
        self._mask_rows = self._attention_mask(start=self.width, n=continuation)
        self._position_rows = super()._step_positions(continuation)  # [B, continuation]; nothing fed yet

    def _open_keys(self, keys: int) -> torch.Tensor:
        return self._all_keys_open

    def _step_mask(self, n: int) -> torch.Tensor:
        end = self.width + self.fed + n
        if end > self.slots:
            raise ValueError(f"static cache of {self.slots} slots is full: tokens up to slot {end} were fed")
        # contiguous: every step of a kind passes the compiled forward the same strides
        return self._mask_rows[:, :, self.fed : self.fed + n].contiguous()

    def _step_positions(self, n: int) -> torch.Tensor:
        return self._position_rows[:, self.fed : self.fed + n].contiguous()

    def _key_slots(self, end: int) -> int:
        return self.slots

    def keep_shared(self, n: int) -> None:
        if n > self.fed:
            raise ValueError(f"cannot keep {n} continuation tokens: only {self.fed} were fed")
        if n < self.fed:
            self.model.rewind_static_cache(self.cache, self.width + n)
            self.fed = n

    def _forward(self, mask: torch.Tensor, positions: torch.Tensor, *, keep: int, step: bool,
                 **inputs) -> torch.Tensor:
        if not (self.compiled and step):
            return super()._forward(mask, positions, keep=keep, step=step, **inputs)
        return self.model.logits(cache=self.cache, attention_mask=mask, position_ids=positions, keep=keep,
                                 compiled=True, steps=self.step_log, **inputs)
