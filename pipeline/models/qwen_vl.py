"""The adapter for Qwen2.5-VL: dynamic-resolution images and M-RoPE positions.

Qwen2.5-VL gives every input position three rotary coordinates (time, height, width). Text
tokens have the same value on all three; an image's rows, a `t x h x w` grid of merged patches,
take `start + (i, j, k)` from the text before it, and the text after it continues from `start
+ max(h, w)`, not from `start + t*h*w`. After the prompt, every token's three coordinates are its
plain index plus the prompt's *rope delta* (its largest coordinate + 1 - its length), the same
for all axes. So the engine keeps its one-number positions everywhere and adds the delta
per row, and only the prefill reads the three coordinates of each prompt row
(`pipeline.decoding.rows`). Image rows come from the model's own `get_image_features`, each
image at its own resolution (a different number of rows per image and per request).

The adapter remembers the grid of each feature tensor it returns, and the coordinates of each
prompt row spliced from them (`spliced`, `prompt_positions`): a method that makes image rows
some other way gets a clear error, never 1-D positions over an image.
"""
from __future__ import annotations

from typing import Sequence

import torch
from PIL import Image
from torch.utils.weak import WeakTensorKeyDictionary
from transformers import PreTrainedModel

from pipeline.models.base import ModelInputError
from pipeline.models.chatml import HFChatModel


class HFQwenVL(HFChatModel):
    """A Qwen2.5-VL checkpoint through its own transformers class, each `<image>` as
    `<|vision_start|><|image_pad|><|vision_end|>` with one `<|image_pad|>` that the image's
    rows replace."""

    image_in_chat = "<|vision_start|><|image_pad|><|vision_end|>"

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor, name)
        self.merge = model.config.vision_config.spatial_merge_size
        self._grids = WeakTensorKeyDictionary()  # an image's rows -> their (t, h, w) grid
        self._layouts = WeakTensorKeyDictionary()  # a spliced prompt row -> its [3, L] coordinates

    @torch.inference_mode()
    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        if pooled:
            raise ModelInputError(f"{self.name}: pooled drafting (P) is not supported on {self.family}")
        if not images:
            return []
        pixels = self.processor.image_processor(list(images), return_tensors="pt")
        grids = pixels["image_grid_thw"]
        pixel_values = pixels["pixel_values"].to(self.device, self.dtype)
        out = self.model.model.get_image_features(pixel_values=pixel_values,
                                                  image_grid_thw=grids.to(self.device))
        features = list(out.pooler_output)
        for rows, (t, h, w) in zip(features, grids.tolist()):
            self._grids[rows] = (t, h // self.merge, w // self.merge)
        return features

    def spliced(self, embeds: torch.Tensor, parts: Sequence[torch.Tensor | Sequence[int]]) -> torch.Tensor:
        axes, start = [], 0
        for part in parts:
            if isinstance(part, torch.Tensor):
                grid = self._grids.get(part)
                if grid is None:
                    raise ModelInputError(f"{self.name}: image rows this model's `image_features` did not "
                                          "return; M-RoPE needs each image's grid to place them")
                axes.append(grid_positions(*grid) + start)
                start += max(grid[1], grid[2])
            else:
                axes.append(torch.arange(start, start + len(part)).expand(3, -1))
                start += len(part)
        self._layouts[embeds] = torch.cat(axes, dim=1)
        return embeds

    def prompt_positions(self, embeds: torch.Tensor) -> torch.Tensor | None:
        return self._layouts.get(embeds)


def grid_positions(t: int, h: int, w: int) -> torch.Tensor:
    """`[3, t*h*w]` coordinates of an image's rows (row-major over the grid), from 0."""
    grid = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack(grid).reshape(3, -1)
