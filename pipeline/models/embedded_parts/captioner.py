"""The caption model of drafting method C for the embedded pair: a colour head and a shape
head (linear, on globally averaged EfficientNet features), writing e.g. "a blue circle"."""
from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from pipeline.models.embedded_parts.easyvqa import COLORS, SHAPES
from pipeline.models.embedded_parts.vision import FEATURE_DIM, VisionEncoder


class ShapeHeads(torch.nn.Module):
    """Pooled features `[n, 1280]` -> colour logits `[n, 8]` and shape logits `[n, 3]`."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("feature_mean", torch.zeros(FEATURE_DIM))
        self.register_buffer("feature_std", torch.ones(FEATURE_DIM))
        self.color = torch.nn.Linear(FEATURE_DIM, len(COLORS))
        self.shape = torch.nn.Linear(FEATURE_DIM, len(SHAPES))

    def forward(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = (pooled - self.feature_mean) / self.feature_std
        return self.color(x), self.shape(x)

    @staticmethod
    def pool(grid: torch.Tensor) -> torch.Tensor:
        """`[n, 1280, 7, 7]` feature map -> `[n, 1280]` global average."""
        return grid.mean(dim=(2, 3))

    def save(self, path: Path) -> None:
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, str(path))

    @classmethod
    def load(cls, path: Path) -> "ShapeHeads":
        if not Path(path).is_file():
            raise FileNotFoundError(f"captioner weights {path} are missing: run scripts/train_embedded.py")
        heads = cls()
        heads.load_state_dict(load_file(str(path)))
        return heads.eval().requires_grad_(False)


def caption_text(color_index: int, shape_index: int) -> str:
    return f"a {COLORS[color_index]} {SHAPES[shape_index]}"


class EmbeddedCaptioner:
    """`caption(image) -> "a blue circle"` (the Captioner protocol of pipeline.drafting)."""

    def __init__(self, vision: VisionEncoder, heads: ShapeHeads) -> None:
        self.vision = vision
        self.heads = heads.to(vision.device)

    @torch.no_grad()
    def caption(self, image: Image.Image) -> str:
        color, shape = self.heads(ShapeHeads.pool(self.vision.grid([image])))
        return caption_text(int(color.argmax()), int(shape.argmax()))
