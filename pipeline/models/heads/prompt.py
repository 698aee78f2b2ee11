"""What a head makes of a prompt: its input rows, beside what most heads never need (ViSpec's
image rows that no later row attends to, and the image summary fused into every later token)."""
from __future__ import annotations

from typing import NamedTuple

import torch


class PromptRows(NamedTuple):
    """A prompt as a head reads it (token p beside the target's features at p - 1)."""

    rows: torch.Tensor  # [L, H]: the head's input rows
    unseen: torch.Tensor | None = None  # [L] bool: rows no later row attends to (None: all are seen)
    summary: torch.Tensor | None = None  # [H]: fused into every token after the prompt (None: nothing)


class FusesPrompts:
    """A head whose prompt rows are its token rows: each fused like a drafted token (EAGLE's)."""

    def fuse(self, embeds: torch.Tensor, features: torch.Tensor,
             summary: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def fuse_prompt(self, embeds: torch.Tensor, features: torch.Tensor,
                    visual: torch.Tensor | None = None) -> PromptRows:
        """`embeds` `[L, H]` (the prompt without its first token) beside the target's features
        one position earlier; `visual` `[L]` marks its image rows, which most heads fuse like any."""
        return PromptRows(self.fuse(embeds, features))
