"""Rows of several requests in one batch, each keeping its own number of continuation tokens.

A single request's rows share every continuation slot; a batch of requests cannot, since each
accepts its own number of proposals per block. Here every block is still written at shared
slots (one write position, static shapes), and each row keeps its own accepted prefix:

- row r's valid continuation is slots `[0, kept_r)`, plus, inside the block being fed (slots
  `[base, fed)`), slots from `base + skip_r` on (`skip_r` leading fillers: a request with
  fewer pending tokens than the widest is right-aligned);
- a token's position is the row's prompt length plus its index in that valid sequence, so the
  gap `[kept_r, base + skip_r)` is invisible and costs nothing but masked keys;
- `feed_ragged_tree` feeds each row its own token tree (a candidate tree's nodes) in one
  forward: a node sees the row's prefix, the root and its own ancestors, at position
  prefix + depth;
- `settle(keep, order)` moves each row's first `keep_r` kept block tokens (in block order, or
  a tree's accepted path) down to `kept_r`, in place, and the next block starts at the longest
  row's end: the cache never holds more than the longest request's tokens plus one block;
- `copy_rows` (the rows' own) gives every branch's rows of a request its accepted branch's block.

Masks and positions are built on the device from `kept` and `skip`; the host keeps its own copy
of both (the counts come back in the block's one transfer), so it knows when nothing has to
move: every row of an AR step, or of a block all rows accepted alike, keeps its tokens in place.
"""
from __future__ import annotations

import torch

from pipeline.decoding.rows import DynamicCacheRows, StaticCacheRows


class Ragged:
    """The ragged verbs over a KV-cache rows class (mixed in before it)."""

    kept: torch.Tensor  # [rows] on the device; `kept_counts` on the host
    skip: torch.Tensor  # [rows] on the device; `skips` on the host
    base: int

    def start_ragged(self) -> None:
        self.kept_counts, self.skips = [0] * self.rows, [0] * self.rows
        self.kept, self.skip = self._on_device(self.kept_counts), self._on_device(self.skips)
        self.base = self.fed

    def feed_ragged(self, ids: torch.Tensor, valid: list[int] | None = None, keep: int = 1) -> torch.Tensor:
        """Append `ids` `[rows, n]`; `valid` (only as a block's first feed): row r's last
        `valid[r]` tokens are real, the others fillers. fp32 logits of the last `keep`."""
        if valid is not None:
            if self.fed != self.base:
                raise ValueError("fillers go at the start of a block only")
            self.skips = [ids.shape[1] - v for v in valid]
            self.skip = self._on_device(self.skips)
        n = ids.shape[1]
        limit = getattr(self, "slots", None)  # a static cache's size
        if limit is not None and self.width + self.fed + n > limit:
            raise ValueError(f"static cache of {limit} slots is full: tokens up to slot "
                             f"{self.width + self.fed + n}")
        mask, positions = self._ragged_mask(n), self._ragged_positions(n)
        logits = self._forward(mask, positions, keep=keep, input_ids=ids, step=True)
        self.fed += n
        return logits

    def feed_ragged_tree(self, ids: torch.Tensor, depths: torch.Tensor, sees: torch.Tensor,
                         keep: int) -> torch.Tensor:
        """A block's one feed of a token tree per row: `ids`, `depths` `[rows, n]` (the root
        first, depth 0), `sees` `[rows, n, n]` (node i sees node j). fp32 logits of the last `keep`."""
        if self.fed != self.base:
            raise ValueError("a tree is a block's only feed")
        n = ids.shape[1]
        self.skips = [0] * self.rows
        self.skip = self._on_device(self.skips)
        mask = self._ragged_mask(n)
        first = self.width + self.base
        blocked = torch.finfo(mask.dtype).min
        tree = torch.zeros_like(sees, dtype=mask.dtype).masked_fill_(~sees, blocked)
        mask[:, 0, :, first : first + n] = tree
        positions = self._next_position[:, None] + self.kept[:, None] + depths
        logits = self._forward(mask, positions, keep=keep, input_ids=ids, step=True)
        self.fed += n
        return logits

    def settle(self, keep: list[int], order: torch.Tensor | None = None) -> None:
        """Row r keeps `keep[r]` real tokens of the block: its first ones, or those at block
        positions `order` `[rows, span]` (a tree's accepted path, root first), moved in place
        behind its earlier ones; the next block starts after the longest row."""
        span = self.fed - self.base
        in_place = order is None and all(n == 0 or (k == self.base and s == 0)
                                         for k, n, s in zip(self.kept_counts, keep, self.skips))
        if span and not in_place:
            counts = self._on_device(keep)
            steps = torch.arange(span, device=counts.device)
            if order is None:
                order = self.skip[:, None] + steps[None, :]
            # entries past keep_r repeat the last kept one (the same write twice), or write a
            # slot onto itself in a row that keeps nothing: no two writes differ
            entry = torch.minimum(steps[None, :], (counts[:, None] - 1).clamp_min(0))
            source = self.width + self.base + order.gather(1, entry)
            target = torch.where(counts[:, None] > 0, self.width + self.kept[:, None] + entry, source)
            for layer in self.cache.layers:
                for states in (layer.keys, layer.values):
                    heads, width = states.shape[1], states.shape[3]
                    index = lambda slots: slots[:, None, :, None].expand(-1, heads, -1, width)
                    moved = states.gather(2, index(source))
                    states.scatter_(2, index(target), moved)
        self.kept_counts = [k + n for k, n in zip(self.kept_counts, keep)]
        self.skips = [0] * self.rows
        self.kept, self.skip = self._on_device(self.kept_counts), self._on_device(self.skips)
        longest = max(self.kept_counts)
        self._rewind(longest)
        self.base = self.fed = longest

    def _on_device(self, counts: list[int]) -> torch.Tensor:
        return torch.tensor(counts, dtype=torch.long, device=self.model.device)

    def _ragged_positions(self, n: int) -> torch.Tensor:
        slots = torch.arange(self.fed, self.fed + n, device=self.kept.device)
        index = (slots[None, :] - self.base - self.skip[:, None]).clamp_min(0)
        return self._next_position[:, None] + self.kept[:, None] + index

    def _ragged_mask(self, n: int) -> torch.Tensor:
        """Additive `[rows, 1, n, keys]`: the prompt (not padding), the row's kept tokens, and its
        real block tokens up to the query."""
        keys = self._key_slots(self.width + self.fed + n)
        device = self.kept.device
        slot = torch.arange(keys, device=device) - self.width  # continuation index of every key
        query = torch.arange(self.fed, self.fed + n, device=device)
        prompt = torch.zeros(self.rows, keys, dtype=torch.bool, device=device)
        prompt[:, : self.width] = self._padding
        kept = (slot[None, :] >= 0) & (slot[None, :] < self.kept[:, None])  # [rows, keys]
        in_block = slot[None, :] >= (self.base + self.skip)[:, None]  # [rows, keys]
        causal = slot[None, :] <= query[:, None]  # [n, keys]
        visible = (prompt | kept)[:, None, :] | (in_block[:, None, :] & causal[None])
        mask = torch.zeros(visible.shape, dtype=self.model.dtype, device=device)
        return mask.masked_fill_(~visible, torch.finfo(self.model.dtype).min)[:, None]


class RaggedDynamicRows(Ragged, DynamicCacheRows):
    """Ragged rows over a `DynamicCache` (engine `eager`)."""

    def _rewind(self, longest: int) -> None:
        if self.fed > longest:
            self.cache.crop(longest - self.fed)


class RaggedStaticRows(Ragged, StaticCacheRows):
    """Ragged rows over a `StaticCache` (engine `static`)."""

    def _rewind(self, longest: int) -> None:
        if self.fed > longest:
            self.model.rewind_static_cache(self.cache, self.width + longest)


RaggedRows = RaggedDynamicRows | RaggedStaticRows
