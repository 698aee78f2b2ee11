"""The adapter for Gemma 3: sliding-window attention layers and bidirectional attention among an
image's tokens.

Most of Gemma 3's layers attend only to the last `sliding_window` positions; transformers gives
them a cache that keeps only those. A rollback (rejected proposals) or a token tree would then
need slots the window has already dropped. Here every layer keeps a full cache: the engine's
own (a `DynamicCache` of full layers, or a `StaticCache` built from `cache_config`, a copy of
the config with every layer full), and the window is applied by
the mask alone, per layer kind. The engine builds one causal mask over the cache; `_forward`
hands the model a mask per layer kind, as transformers does for it (`full_attention`,
`sliding_attention`):

- sliding layers see, of the keys the causal mask shows a query, the last `sliding_window`: the
  keys a query sees are always positions 0, 1, ..., its own, in slot order (a row's kept tokens
  sit in order behind its prompt; a tree node sees its ancestors), so counting them from the
  query back is counting positions;
- at the prefill, an image's tokens also see each other, later ones included (the family's
  bidirectional image attention), in every layer: the later ones are within the window by
  construction.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from PIL import Image
from torch.utils.weak import WeakTensorKeyDictionary
from transformers import Cache, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from pipeline.models.base import ModelInputError
from pipeline.models.chat_formats import to_gemma
from pipeline.models.chat_models import HFChatModel
from pipeline.models.grids import pooled_grid
from pipeline.models.hf import HFModel

GEMMA_IMAGE = "\n\n<start_of_image><image_soft_token><end_of_image>\n\n"  # one placeholder per image


class SlidingWindowMasks:
    """Full caches and per-layer-kind masks for a model with sliding-window layers (module
    docstring); mixed into an `HFModel` subclass, which calls `_full_caches` once built."""

    window: int
    cache_config: PretrainedConfig

    def _full_caches(self, text: PretrainedConfig) -> None:
        self.window = text.sliding_window
        self.cache_config = copy.deepcopy(text)  # every layer a full static cache: the window is the mask's
        self.cache_config.layer_types = ["full_attention"] * len(text.layer_types)
        self.cache_config.sliding_window = None

    def _forward(self, cache: Cache, keep: int, compiled: bool, **inputs) -> torch.Tensor:
        blocks = inputs.pop("image_blocks", None)
        inputs["attention_mask"] = self._layer_masks(inputs["attention_mask"], blocks)
        return super()._forward(cache, keep, compiled, **inputs)

    def _layer_masks(self, mask: torch.Tensor, blocks: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The engine's causal additive mask `[rows, 1, queries, keys]` as one mask per layer
        kind; `blocks` (the prefill's image blocks, over its first keys) lets an image's tokens
        see each other."""
        seen = mask == 0
        blocked = torch.finfo(mask.dtype).min
        later = (seen.flip(-1).cumsum(-1).flip(-1) - 1)  # keys the query sees after this one
        windowed = seen & (later < self.window)
        if blocks is not None:  # the prefill: queries and its first keys are the prompt slots
            width = blocks.shape[1]
            same = (blocks[:, :, None] == blocks[:, None, :]) & (blocks[:, :, None] >= 0)
            ahead = torch.ones(width, width, dtype=torch.bool, device=same.device).triu(1)
            image = torch.zeros_like(seen)
            image[:, 0, :, :width] = same
            seen = seen | image
            image[:, 0, :, :width] &= ahead  # earlier keys of the image: the window applies to them
            windowed = windowed | image
        return {"full_attention": torch.zeros_like(mask).masked_fill_(~seen, blocked),
                "sliding_attention": torch.zeros_like(mask).masked_fill_(~windowed, blocked)}


class HFGemma3(SlidingWindowMasks, HFChatModel):
    """A Gemma 3 checkpoint (`Gemma3ForConditionalGeneration`), prompted in Gemma's turns, each
    `<image>` as `<start_of_image>` with one `<image_soft_token>` that the image's rows replace."""

    render = staticmethod(to_gemma)
    template_image, image_in_chat = "<start_of_image>", GEMMA_IMAGE  # its processor's expansion

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor, name)
        self._full_caches(model.config.get_text_config())
        self._blocks = WeakTensorKeyDictionary()  # a spliced prompt row -> its image blocks

    @property
    def supports_pooling(self) -> bool:
        return True

    @torch.inference_mode()
    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        """Each image's rows (its patch grid pooled to `mm_tokens_per_image`, a square);
        `pooled` (method P): that square averaged 2x2 again."""
        if not images:
            return []
        pixels = self.processor.image_processor(list(images), return_tensors="pt")
        out = self.model.model.get_image_features(pixels["pixel_values"].to(self.device, self.dtype))
        rows = list(out.pooler_output)
        if pooled:
            side = math.isqrt(rows[0].shape[0])
            rows = [pooled_grid(image, (1, side, side))[0] for image in rows]
        return rows

    def spliced(self, embeds: torch.Tensor, parts: Sequence[torch.Tensor | Sequence[int]]) -> torch.Tensor:
        blocks, image = [], 0
        for part in parts:
            is_image = isinstance(part, torch.Tensor)
            blocks.append(torch.full((len(part),), image if is_image else -1))
            image += is_image
        if image:
            self._blocks[embeds] = ImageBlocks(torch.cat(blocks))
        return embeds

    def prompt_extras(self, embeds: torch.Tensor) -> ImageBlocks | None:
        return self._blocks.get(embeds)

    def prefill_inputs(self, extras: Sequence[ImageBlocks | None], padding: torch.Tensor) -> dict[str, Any]:
        """Each prompt slot's image block (-1: text or padding) as one `[rows, width]`."""
        width = padding.shape[1]
        blocks = torch.full(padding.shape, -1, dtype=torch.long)
        for row, (length, extra) in enumerate(zip(padding.sum(-1).tolist(), extras)):
            if extra is not None:
                blocks[row, width - length:] = extra.blocks[:length]
        return {"image_blocks": blocks.to(self.device)}


class HFGemma3Text(SlidingWindowMasks, HFChatModel):
    """A text-only Gemma 3 checkpoint (`gemma-3-1b-it`, model type `gemma3_text`) drafting for a
    Gemma 3 target with the methods that need no image features (T, C): the same turns and
    image markers as the target, sliding-window layers alike."""

    render = staticmethod(to_gemma)
    template_image, image_in_chat = "<start_of_image>", GEMMA_IMAGE  # its processor's expansion

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str) -> None:
        HFModel.__init__(self, model, tokenizer, name)  # no processor: no images
        self.processor = None
        self.family = model.config.model_type
        self.image_token_id = tokenizer.convert_tokens_to_ids("<image_soft_token>")
        self._full_caches(model.config)

    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        raise ModelInputError(f"{self.name} is a text-only Gemma 3 model: it drafts with T or C, not with "
                              "image features")


@dataclass
class ImageBlocks:
    """A prompt row's image blocks: per position, the index of the image it belongs to, -1 for text."""

    blocks: torch.Tensor
