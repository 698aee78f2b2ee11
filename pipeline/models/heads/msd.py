"""MSD's head (Lyn-Lucy/MSD; the integrated copy in MMSpec's `method/msd/cnets.py`): EAGLE-1's
layout and files (`pipeline.models.heads.eagle`), its `config.json` a clone of the target's with
one layer, but image and text tokens decoupled: at a prompt's image rows the head reads the
projected visual embedding itself, in place of `fc`'s fusion with the target's state; text
tokens are fused as EAGLE's are."""
from __future__ import annotations

import torch

from pipeline.models.heads.eagle import EagleHead
from pipeline.models.heads.prompt import PromptRows


class MsdHead(EagleHead):
    """EAGLE's head whose prompt image rows are their visual embeddings, unfused."""

    def fuse_prompt(self, embeds: torch.Tensor, features: torch.Tensor,
                    visual: torch.Tensor | None = None) -> PromptRows:
        fused = self.fuse(embeds, features)
        if visual is None:
            return PromptRows(fused)
        return PromptRows(torch.where(visual.to(fused.device)[..., None], embeds.to(fused.dtype), fused))
