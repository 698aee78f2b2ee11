"""Rows of a head draft (EAGLE's and its kind): the engine's KV rows over the head's one layer,
where every token comes with features, the state the target's LM head would read before it.

- The prompt: the head sees token p beside the target's features at p - 1, so a prompt row is
  the target's spliced prompt without its first token, each row fused with the target's
  features one position earlier (`model.fuse_prompt`, told which rows are image rows: MSD reads
  those unfused, ViSpec adapts each image's rows, hides the rest from later rows and fuses a
  summary of the image into every later token); image rows come in as the target embeds them.
  Positions are the rows' plain indices (a head's layer rotates by them, even for an M-RoPE
  target), or, for a head trained on its target's M-RoPE positions, each token's own.
- A block starts with the tokens the head has not read with the target's features: the target's
  token after the last block and the proposals it accepted there (`Pending.reread`), each beside
  the target's features before it. Drafting on, each token takes the head's own prediction at
  the position before it (its parent's, in a tree level).
- Settling keeps only what was read with the target's features (`rereads_kept`): the accepted
  proposals were read beside the head's own guesses, so the next block reads them again, as
  EAGLE's reference code does (its `stable_kv`).
"""
from __future__ import annotations

import torch

from pipeline.decoding.rows import DynamicCacheRows
from pipeline.decoding.static_rows import StaticCacheRows
from pipeline.models.base import LVLM, ModelInputError, StepLog


class HeadRows:
    """The head's verbs over a KV rows class (mixed in before it); `target_states`: each prompt
    row's target features `[L_i, F]` at the prompt's positions."""

    rereads_kept = True

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], *, target_states: list[torch.Tensor],
                 per_request: int = 1, step_log: StepLog | None = None,
                 positions: list[torch.Tensor | None] | None = None, extras: list | None = None,
                 **engine: object) -> None:
        if any(p.shape[0] < 2 for p in prompts):
            raise ModelInputError(f"{model.name}: a head needs a prompt of at least three tokens")
        visual = extras or [None] * len(prompts)  # each row's image rows (`HeadDraft.prompt_extras`)
        with torch.inference_mode():
            read = [model.fuse_prompt(embeds[1:], states[:-1], None if rows is None else rows[1:len(embeds)])
                    for embeds, states, rows in zip(prompts, target_states, visual)]
        unseen = [prompt.unseen for prompt in read]
        unseen = unseen if any(flags is not None for flags in unseen) else None
        # a head's layer rotates by sequence index, whatever the target's positions (M-RoPE's three
        # coordinates for a Qwen-VL target) are, unless it was trained on them: then a row takes
        # its token's (`model.target_positions`)
        own = [None if p is None else p[:, 1:] for p in positions or [None] * len(prompts)]
        super().__init__(model, [prompt.rows for prompt in read], per_request=per_request, step_log=step_log,
                         positions=own if model.target_positions else None, extras=None, unseen=unseen,
                         **engine)
        # what every later token is fused with, per row (ViSpec's image summary), or None
        self._summary = (torch.stack([prompt.summary for prompt in read]).to(model.device)
                         if read[0].summary is not None else None)
        self._features: torch.Tensor | None = None  # each token's features in the next forward
        self._last: torch.Tensor | None = None  # the head's prediction at each row's last position
        self._level: torch.Tensor | None = None  # its predictions at the nodes of the last level fed
        self._pending = [0] * self.rows  # tokens this block began with, read with the target's features

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1, valid: list[int] | None = None,
             hidden: tuple[int, ...] = (), features: torch.Tensor | None = None) -> torch.Tensor:
        n = torch.as_tensor(token_ids).shape[-1]
        if features is not None:  # a block's first feed: the target's features before each token
            self._pending = list(valid) if valid is not None else [n] * self.rows
            self._features = features
        elif n == 1:  # a drafted token: the head's own prediction before it
            self._features = self._last
        else:
            raise ValueError("a head reads drafted tokens one at a time, after a block's first feed")
        return super().feed(token_ids, keep=keep, valid=valid, hidden=hidden)

    def begin_tree(self) -> None:
        super().begin_tree()
        self._level = self._last  # the root: the last token the block fed

    def feed_level(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        rows_parents = parents.repeat_interleave(self.per_request, 0)
        self._features = self._level.gather(1, rows_parents[..., None].expand(-1, -1, self._level.shape[-1]))
        return super().feed_level(tokens, parents)

    def settle(self, keep: list[int], order: torch.Tensor | None = None) -> None:
        super().settle([min(k, p) for k, p in zip(keep, self._pending)], order)
        self._pending = [0] * self.rows

    def _forward(self, mask: torch.Tensor, positions: torch.Tensor, *, keep: int, step: bool,
                 hidden: tuple[int, ...] = (), **inputs) -> torch.Tensor:
        if "input_ids" in inputs:
            inputs["features"] = self._features
            if self._summary is not None:
                inputs["image_summary"] = self._summary
        logits, states = super()._forward(mask, positions, keep=keep, step=step, hidden=hidden, **inputs)
        self._last, self._level = states[:, -1:], states
        return logits


class HeadDynamicRows(HeadRows, DynamicCacheRows):
    """A head's rows on the `eager` engine."""


class HeadStaticRows(HeadRows, StaticCacheRows):
    """A head's rows on the `static` engine (compiled steps carry the features as an input)."""
