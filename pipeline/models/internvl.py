"""The adapter for InternVL3 (transformers' `internvl` class, the `-hf` checkpoints).

InternVL cuts an image into 448-pixel tiles (a grid matched to its aspect, plus a thumbnail of
the whole image when there is more than one tile), runs each tile through the vision tower,
and folds each tile's patch grid 2x2 into channels (pixel shuffle) before the projector: 256
rows per tile. Positions are one per token (a Qwen2.5 language model). Pooled drafting (P) is
refused: an image is several tiles, not one patch grid.
"""
from __future__ import annotations

from typing import Sequence

import torch
from PIL import Image

from pipeline.models.base import ModelInputError
from pipeline.models.chat_models import HFChatModel


class HFInternVL(HFChatModel):
    """An InternVL checkpoint, each `<image>` as `<img><IMG_CONTEXT></img>` with one
    `<IMG_CONTEXT>` that the rows of all the image's tiles replace."""

    template_image = "<IMG_CONTEXT>"  # its processor wraps each in <img> ... </img>
    image_in_chat = "<img><IMG_CONTEXT></img>"

    @torch.inference_mode()
    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        if pooled:
            raise ModelInputError(f"{self.name}: pooled drafting (P) is not supported on {self.family} "
                                  "(an image is several tiles)")
        if not images:
            return []
        pixels = self.processor.image_processor(list(images), crop_to_patches=True, return_tensors="pt")
        config = self.model.config
        out = self.model.model.get_image_features(
            pixel_values=pixels["pixel_values"].to(self.device, self.dtype),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
        )
        tiles = torch.split(out.pooler_output, pixels["num_patches"].tolist())
        return [rows.reshape(-1, rows.shape[-1]) for rows in tiles]
