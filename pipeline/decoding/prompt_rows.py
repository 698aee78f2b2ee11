"""Prompts of different lengths as one left-padded batch: their embeddings, and their position
ids where a model's positions are not a row's plain indices (M-RoPE's three coordinates)."""
from __future__ import annotations

import torch


def left_padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt embeddings `[L_i, hidden]` as one left-padded batch `[B, width, hidden]`, and
    `[B, width]` bool, False where a row is padding."""
    width = max(p.shape[0] for p in prompts)
    embeds = prompts[0].new_zeros(len(prompts), width, prompts[0].shape[-1])
    padding = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        embeds[row, width - prompt.shape[0]:] = prompt
        padding[row, width - prompt.shape[0]:] = True
    return embeds, padding


def left_padded_flags(flags: list[torch.Tensor | None], width: int) -> torch.Tensor:
    """Per-row bool flags `[L_i]` (None: all False) left-padded as `[rows, width]`, False at padding."""
    padded = torch.zeros(len(flags), width, dtype=torch.bool)
    for row, given in enumerate(flags):
        if given is not None:
            padded[row, width - given.shape[0]:] = given.cpu()
    return padded


def padded_positions(prompts: list[torch.Tensor], positions: list[torch.Tensor | None],
                     width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt position ids `[axes, L_i]` (None: the row's indices on every axis) left-padded as
    one `[axes, rows, width]` (0 at padding), and each row's delta `[rows]`: its largest position
    + 1 - its length, what every later position adds to its index (M-RoPE's rope delta)."""
    axes = max(p.shape[0] for p in positions if p is not None)
    padded = torch.zeros(axes, len(prompts), width, dtype=torch.long)
    deltas = torch.zeros(len(prompts), dtype=torch.long)
    for row, (prompt, given) in enumerate(zip(prompts, positions)):
        length = prompt.shape[0]
        layout = torch.arange(length).expand(axes, -1) if given is None else given
        padded[:, row, width - length:] = layout
        deltas[row] = int(layout.max()) + 1 - length if length else 0
    return padded, deltas
