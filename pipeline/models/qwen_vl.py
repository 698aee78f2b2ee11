"""The adapters for Qwen2.5-VL and Qwen3-VL: dynamic-resolution images and M-RoPE positions
(and Qwen3-VL's DeepStack features, `HFQwen3VL`).

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

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from PIL import Image
from torch.utils.weak import WeakTensorKeyDictionary
from transformers import PreTrainedModel

from pipeline.models.base import ModelInputError
from pipeline.models.chat_models import HFChatModel
from pipeline.models.grids import grid_positions, pooled_grid
from pipeline.models.hf import chosen_states


class HFQwenVL(HFChatModel):
    """A Qwen2.5-VL checkpoint through its own transformers class, each `<image>` as
    `<|vision_start|><|image_pad|><|vision_end|>` with one `<|image_pad|>` that the image's
    rows replace."""

    # what its template writes for an image is what its processor reads: it expands the pad
    image_in_chat = template_image = "<|vision_start|><|image_pad|><|vision_end|>"

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor, name)
        self.merge = model.config.vision_config.spatial_merge_size
        self._grids = WeakTensorKeyDictionary()  # an image's rows -> their (t, h, w) grid
        self._deepstack = WeakTensorKeyDictionary()  # an image's rows -> their DeepStack features per layer
        self._layouts = WeakTensorKeyDictionary()  # a spliced prompt row -> its [3, L] coordinates

    @property
    def supports_pooling(self) -> bool:
        return True

    @torch.inference_mode()
    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        """Each image's rows; `pooled` (method P): its merged patch grid averaged 2x2."""
        if not images:
            return []
        pixels = self.processor.image_processor(list(images), return_tensors="pt")
        grids = pixels["image_grid_thw"]
        pixel_values = pixels["pixel_values"].to(self.device, self.dtype)
        made = []
        images_rows = self._image_rows(pixel_values, grids.to(self.device))
        for (rows, layers), (t, h, w) in zip(images_rows, grids.tolist()):
            grid = (t, h // self.merge, w // self.merge)
            if pooled:
                layers = [pooled_grid(features, grid)[0] for features in layers]
                rows, grid = pooled_grid(rows, grid)
            self._grids[rows] = grid
            self._deepstack[rows] = layers
            made.append(rows)
        return made

    def _image_rows(self, pixel_values: torch.Tensor,
                    grids: torch.Tensor) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        """Each image's rows from the class's own `get_image_features`, with the features the
        language model adds to them inside (Qwen3-VL's DeepStack; none for Qwen2.5-VL)."""
        out = self.model.model.get_image_features(pixel_values=pixel_values, image_grid_thw=grids)
        return [(rows, []) for rows in out.pooler_output]

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


class HFQwen3VL(HFQwenVL):
    """A Qwen3-VL checkpoint: Qwen2.5-VL's prompts and M-RoPE positions (interleaved over the
    head, which the model's rotary embedding does), plus DeepStack. The vision tower also hands
    out features of some of its middle layers, one set per image row, and the language model
    adds set k to the image rows' hidden states after its decoder layer k. A prefill that only
    splices the final features would silently drop them, so the prefill here runs the language
    model with the image rows' mask and DeepStack features of every prompt row, as the class's
    own forward does."""

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor, name)
        self._extras = WeakTensorKeyDictionary()  # a spliced prompt row -> its `DeepStackRow`

    def _image_rows(self, pixel_values: torch.Tensor,
                    grids: torch.Tensor) -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
        out = self.model.model.get_image_features(pixel_values=pixel_values, image_grid_thw=grids)
        deepstack = out.deepstack_features
        return [(rows, [layer[i] for layer in deepstack]) for i, rows in enumerate(out.pooler_output)]

    def spliced(self, embeds: torch.Tensor, parts: Sequence[torch.Tensor | Sequence[int]]) -> torch.Tensor:
        embeds = super().spliced(embeds, parts)
        images = [part for part in parts if isinstance(part, torch.Tensor)]
        if images:
            visual = torch.cat([torch.full((len(part),), isinstance(part, torch.Tensor)) for part in parts])
            layers = zip(*(self._deepstack[rows] for rows in images))
            self._extras[embeds] = DeepStackRow(visual, [torch.cat(layer) for layer in layers])
        return embeds

    def prompt_extras(self, embeds: torch.Tensor) -> DeepStackRow | None:
        return self._extras.get(embeds)

    def prefill_inputs(self, extras: Sequence[DeepStackRow | None], padding: torch.Tensor) -> dict[str, Any]:
        """The image rows of every prompt row as one `[rows, width]` mask, and each DeepStack
        layer's features of those rows in the mask's (row-major) order."""
        width = padding.shape[1]
        mask = torch.zeros(padding.shape, dtype=torch.bool)
        layers: list[list[torch.Tensor]] = []
        for row, (length, extra) in enumerate(zip(padding.sum(-1).tolist(), extras)):
            if extra is None:
                continue
            mask[row, width - length:] = extra.visual[:length]
            layers.append([features[: int(extra.visual[:length].sum())] for features in extra.layers])
        if not layers:
            return {}
        return {"visual_pos_masks": mask.to(self.device),
                "deepstack_visual_embeds": [torch.cat(layer) for layer in zip(*layers)]}

    def _forward(self, cache, keep: int, compiled: bool, hidden: tuple[int, ...] = (),
                 **inputs) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if "visual_pos_masks" not in inputs:
            return super()._forward(cache, keep, compiled, hidden=hidden, **inputs)
        out = self.model.model.language_model(**inputs, cache=cache, use_cache=True,
                                              output_hidden_states=bool(hidden))
        logits = self.model.lm_head(out.last_hidden_state[:, -keep:]).float()
        return (logits, chosen_states(out.hidden_states, hidden)) if hidden else logits


@dataclass
class DeepStackRow:
    """A prompt row's image rows (`visual`, `[L]` bool) and their DeepStack features, one
    `[image rows, hidden]` tensor per layer that receives them."""

    visual: torch.Tensor
    layers: list[torch.Tensor]
