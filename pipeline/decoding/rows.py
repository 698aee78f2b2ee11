"""Prompt rows decoded as ONE batch over one KV cache: B requests, each with its rows (the
target's one row, or the draft's row per drafting method and branch), request-major
(docs/algorithm.md §3).

Every block is written at shared cache slots (one write position: static shapes), and each row
keeps its own accepted prefix, since requests accept their own number of proposals:

- row r's continuation is slots `[0, kept_r)`, plus, inside the block being fed (slots
  `[base, fed)`), slots from `base + skip_r` on (`skip_r` leading fillers: a request with fewer
  pending tokens than the widest is right-aligned, so the block's last token sits at one slot);
- a token's position is the row's prompt length plus its index in that sequence, so the gap
  `[kept_r, base + skip_r)` is invisible and costs nothing but masked keys; a model whose prompt
  positions are not plain indices (M-RoPE's three coordinates per token) gives each prompt row's
  own, which the prefill reads, and every later position adds the row's delta
  (`pipeline.decoding.prompt_rows`);
- `feed_tree` feeds tokens that see only their ancestors among the tree fed since `begin_tree`,
  at positions root + depth (a token tree verified, or a draft tree level, in one forward);
- `settle(keep, order)` moves each row's kept block tokens (in block order, or an accepted
  path's) down behind its earlier ones, in place, and the next block starts at the longest
  row's end; `copy_rows` gives every branch's rows of a request its accepted branch's block.

Prompts are left-padded; masks and positions are built on the device (transformers uses a
prepared 4-D mask as it is, where building one itself would read it back to the host). The
host keeps its own copy of each row's counts (they come back in the block's one transfer), so
it knows when the rows are aligned (every row keeps the same prefix, as one request's rows
always do): then masks are the plain causal ones and nothing moves when a block settles.

Two cache strategies, chosen by the engine (`pipeline.decoding.engine`):
- `DynamicCacheRows` (engine `eager`): transformers' `DynamicCache`, grown by concatenation and
  cropped after each block.
- `StaticCacheRows` (engine `static`, `pipeline.decoding.static_rows`): transformers'
  `StaticCache`, allocated once for the whole decode with fixed-shape masks; rolling back only
  moves the write position, and decode steps have static shapes, so on a GPU they run as
  captured CUDA graphs.
A state-space draft's rows (`pipeline.decoding.state_rows.StateRows`) offer the same verbs.
"""
from __future__ import annotations

import torch

from pipeline.decoding.prompt_rows import left_padded, left_padded_flags, padded_positions
from pipeline.decoding.trees import LevelMask
from pipeline.models.base import LVLM, StepLog
from pipeline.models.sharding import on_devices


class DynamicCacheRows:
    """A batch of prompt rows plus the continuation fed so far (DynamicCache).

    `fed` counts the continuation slots written; `base` is where the current block began;
    `kept_counts` / `skips` (host) are each row's kept tokens and the block's leading fillers.
    `step_log` collects how the decode steps ran (shared by a decode's target and draft rows).
    """

    rereads_kept = False

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], per_request: int = 1,
                 step_log: StepLog | None = None, positions: list[torch.Tensor | None] | None = None,
                 extras: list | None = None, unseen: list[torch.Tensor | None] | None = None) -> None:
        self.model = model
        self.step_log = StepLog() if step_log is None else step_log
        self.rows, self.per_request = len(prompts), per_request
        self._prompt_embeds, padding = left_padded(prompts)
        self.width = padding.shape[1]
        self._padding = padding.to(model.device)  # [rows, width]: False where a row is padded
        # [rows, width]: prompt slots later tokens attend to (not padding, nor a row's `unseen` slots)
        self._prompt_keys = (self._padding if unseen is None
                             else self._padding & ~left_padded_flags(unseen, self.width).to(model.device))
        # per row: the next position
        self._next_position = torch.tensor([p.shape[0] for p in prompts], device=model.device)
        self._extras = extras if extras and any(e is not None for e in extras) else None  # `prompt_extras`
        self._prompt_positions = None  # [axes, rows, width]: prompts whose positions are not their indices
        if positions is not None and any(p is not None for p in positions):
            self._prompt_positions, deltas = padded_positions(prompts, positions, self.width)
            self._prompt_positions = self._prompt_positions.to(model.device)
            self._next_position += deltas.to(model.device)
        self.cache = model.new_cache()
        self.base = self.fed = 0
        self.kept_counts, self.skips = [0] * self.rows, [0] * self.rows
        self._kept = self._skip = None  # device copies, made when rows stop being aligned
        self.tree_start = 0  # the continuation slot where the tree being fed began (`begin_tree`)
        self._levels = LevelMask()

    @property
    def aligned(self) -> bool:
        """Every row keeps the slots before the block and no filler: plain causal masks."""
        return all(k == self.base for k in self.kept_counts) and not any(self.skips)

    def prefill(self, hidden: tuple[int, ...] = ()) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Run the padded prompts once; padded slots get position 0 and are masked out."""
        positions = self._prompt_positions
        if positions is None:
            positions = (self._padding.long().cumsum(-1) - 1).clamp_min(0)
        mask = self._attention_mask(start=0, n=self.width)
        extra = {} if self._extras is None else self.model.prefill_inputs(self._extras, self._padding)
        out = self._forward(mask, positions, keep=1, inputs_embeds=self._prompt_embeds, step=False,
                            hidden=hidden, **extra)
        self._prompt_embeds = None  # the cache holds them now
        return out

    def prompt_states(self, states: torch.Tensor) -> list[torch.Tensor]:
        """Each row's part `[L_i, ...]` of what the prefill returned per prompt slot `[rows, width, ...]`."""
        return [row[real] for row, real in zip(states, self._padding)]

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1, valid: list[int] | None = None,
             hidden: tuple[int, ...] = (),
             features: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(token_ids, device=self.model.device)
        ids = ids.view(1, -1).expand(self.rows, -1) if ids.dim() < 2 else ids
        n = ids.shape[1]
        if valid is not None:
            if self.fed != self.base:
                raise ValueError("fillers go at the start of a block only")
            self._set_skips([n - v for v in valid])
        mask, positions = self._mask(n), self._positions(n)
        out = self._forward(mask, positions, keep=keep, input_ids=ids, step=True, hidden=hidden)
        self.fed += n
        return out

    def begin_tree(self) -> None:
        self.tree_start = self.fed
        self._levels.begin()

    def feed_tree(self, token_ids: torch.Tensor, offsets: torch.Tensor, sees: torch.Tensor, keep: int,
                  hidden: tuple[int, ...] = ()) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append `n` tokens of a tree to each row (`[rows, n]`): token i at the position a chain
        token fed at the tree's first slot would have, plus `offsets[:, i]` (its depth below
        that slot's token), seeing the prefix before the tree and, within the tree fed since
        `begin_tree`, what `sees[:, i]` allows (`[rows, n, tree so far + n]` bool); fp32 logits
        of the last `keep`. Shapes are fixed for a tree kind, so compiled steps are reused."""
        n = token_ids.shape[1]
        mask = self._mask(n).clone()
        first, end = self.width + self.tree_start, self.width + self.fed + n
        blocked = torch.finfo(mask.dtype).min
        tree = torch.zeros(sees.shape, dtype=mask.dtype, device=mask.device).masked_fill_(~sees, blocked)
        mask[:, 0, :, first:end] = tree
        positions = self._positions(1, self.tree_start) + offsets
        out = self._forward(mask, positions, keep=keep, input_ids=token_ids, step=True, hidden=hidden)
        self.fed += n
        return out

    def feed_level(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        sees, depth = self._levels.grow(parents)
        per, width = self.per_request, tokens.shape[1]
        ids = tokens.repeat_interleave(per, 0)
        logits = self.feed_tree(ids, torch.full_like(ids, depth - 1), sees.repeat_interleave(per, 0),
                                keep=width)
        return logits.view(-1, per, width, logits.shape[-1]).transpose(1, 2)

    def settle(self, keep: list[int], order: torch.Tensor | None = None) -> None:
        span = self.fed - self.base
        if max(k + s for k, s in zip(keep, self.skips)) > span:
            raise ValueError(f"cannot keep {max(keep)} tokens of the block: only {span} were fed")
        in_place = order is None and all(n == 0 or (k == self.base and s == 0)
                                         for k, n, s in zip(self.kept_counts, keep, self.skips))
        if span and not in_place:
            self._move(keep, order, span)
        self.kept_counts = [k + n for k, n in zip(self.kept_counts, keep)]
        self._set_skips([0] * self.rows)
        longest = max(self.kept_counts)
        if self.fed > longest:
            self._rewind(longest)
        self.base = self.fed = longest
        self._kept = None if self.aligned else self._on_device(self.kept_counts)

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        first, end = self.width + self.base + start, self.width + self.fed
        sources = on_devices(source.view(-1))
        for layer in self.cache.layers:
            for states in (layer.keys, layer.values):
                grouped = states.view(source.numel(), groups, -1, *states.shape[1:])[..., first:end, :]
                index = sources(states.device).view(-1, 1, 1, 1, 1, 1).expand(-1, 1, *grouped.shape[2:])
                grouped.copy_(grouped.gather(1, index).expand_as(grouped))

    def _move(self, keep: list[int], order: torch.Tensor | None, span: int) -> None:
        """Row r's first `keep[r]` real block tokens, or those at block positions `order[r]`,
        moved to follow its kept prefix (a gather and a scatter per layer and tensor)."""
        counts = self._on_device(keep)
        steps = torch.arange(span, device=counts.device)
        if order is None:
            order = self._on_device(self.skips)[:, None] + steps[None, :]
        # entries past keep_r repeat the last kept one (the same write twice), or write a slot
        # onto itself in a row that keeps nothing: no two writes differ
        entry = torch.minimum(steps[None, : order.shape[1]], (counts[:, None] - 1).clamp_min(0))
        source = self.width + self.base + order.gather(1, entry)
        kept = self._on_device(self.kept_counts)
        target = torch.where(counts[:, None] > 0, self.width + kept[:, None] + entry, source)
        sources, targets = on_devices(source), on_devices(target)
        for layer in self.cache.layers:
            for states in (layer.keys, layer.values):
                heads, size = states.shape[1], states.shape[3]
                index = lambda slots: slots(states.device)[:, None, :, None].expand(-1, heads, -1, size)
                states.scatter_(2, index(targets), states.gather(2, index(sources)))

    def _set_skips(self, skips: list[int]) -> None:
        self.skips = skips
        self._skip = self._on_device(skips) if any(skips) else None

    def _on_device(self, counts: list[int]) -> torch.Tensor:
        return torch.tensor(counts, dtype=torch.long, device=self.model.device)

    def _positions(self, n: int, start: int | None = None) -> torch.Tensor:
        """`[rows, n]` position ids of continuation slots `start, start + 1, ...` (default: the
        next `n`)."""
        start = self.fed if start is None else start
        if self.aligned:
            offsets = torch.arange(start, start + n, device=self.model.device)
            return self._next_position[:, None] + offsets[None, :]
        slots = torch.arange(start, start + n, device=self.model.device)
        skip = 0 if self._skip is None else self._skip[:, None]
        kept = self._kept if self._kept is not None else self._on_device(self.kept_counts)
        return self._next_position[:, None] + kept[:, None] + (slots[None, :] - self.base - skip).clamp_min(0)

    def _mask(self, n: int) -> torch.Tensor:
        """Additive `[rows, 1, n, keys]` mask of the next `n` continuation tokens: the prompt (not
        padding), the row's kept tokens, and its real block tokens up to the query."""
        if self.aligned:
            return self._attention_mask(start=self.width + self.fed, n=n)
        keys = self._key_slots(self.width + self.fed + n)
        device = self._padding.device
        slot = torch.arange(keys, device=device) - self.width  # continuation index of every key
        query = torch.arange(self.fed, self.fed + n, device=device)
        prompt = torch.zeros(self.rows, keys, dtype=torch.bool, device=device)
        prompt[:, : self.width] = self._prompt_keys
        kept = self._kept if self._kept is not None else self._on_device(self.kept_counts)
        skip = self.base if self._skip is None else (self.base + self._skip)[:, None]
        before = (slot[None, :] >= 0) & (slot[None, :] < kept[:, None])  # [rows, keys]
        in_block = slot[None, :] >= skip  # [rows, keys]
        causal = slot[None, :] <= query[:, None]  # [n, keys]
        visible = (prompt | before)[:, None, :] | (in_block[:, None, :] & causal[None])
        mask = torch.zeros(visible.shape, dtype=self.model.dtype, device=device)
        return mask.masked_fill_(~visible, torch.finfo(self.model.dtype).min)[:, None]

    def _key_slots(self, end: int) -> int:
        """How many cache slots the attention reads when the new tokens end at slot `end`."""
        return end

    def _open_keys(self, keys: int) -> torch.Tensor:
        """`[rows, keys]`: False for left padding (and unseen prompt slots), True for every later slot."""
        open_keys = torch.ones(self.rows, keys, dtype=torch.bool, device=self._padding.device)
        open_keys[:, : self.width] = self._prompt_keys
        return open_keys

    def _attention_mask(self, start: int, n: int) -> torch.Tensor:
        """Additive mask `[rows, 1, n, keys]` for `n` new tokens written from cache slot `start`
        of aligned rows: a key is visible if it is not padding and not after the query."""
        keys = self._key_slots(start + n)
        device = self._padding.device
        slots, positions = torch.arange(keys, device=device), torch.arange(start, start + n, device=device)
        causal = slots[None, :] <= positions[:, None]
        visible = self._open_keys(keys)[:, None, None, :] & causal[None, None]
        blocked = torch.finfo(self.model.dtype).min
        mask = torch.zeros(visible.shape, dtype=self.model.dtype, device=device)
        return mask.masked_fill_(~visible, blocked)

    def _rewind(self, length: int) -> None:
        """Drop every continuation slot from `length` on."""
        self.cache.crop(length - self.fed)

    def _forward(self, mask: torch.Tensor, positions: torch.Tensor, *, keep: int, step: bool,
                 hidden: tuple[int, ...] = (), **inputs) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if step:
            self.step_log.modes.add("uncompiled")
        if hidden:  # asked only where a drafter reads them: other forwards never name it
            inputs["hidden"] = hidden
        return self.model.logits(cache=self.cache, attention_mask=mask, position_ids=positions, keep=keep,
                                 **inputs)
