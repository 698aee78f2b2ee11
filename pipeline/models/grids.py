"""Image rows laid out as a grid: their M-RoPE coordinates, and the 2x2 pooling of drafting
method P for families with one grid per image (Qwen-VL's merged patches, Gemma 3's pooled tokens)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def grid_positions(t: int, h: int, w: int) -> torch.Tensor:
    """`[3, t*h*w]` coordinates of an image's rows (row-major over the grid), from 0."""
    grid = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack(grid).reshape(3, -1)


def pooled_grid(rows: torch.Tensor, grid: tuple[int, int, int]) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Rows `[t*h*w, hidden]` of a `t x h x w` grid averaged over each 2x2 block of every frame
    (an odd edge over what it has), and the pooled grid."""
    t, h, w = grid
    frames = rows.reshape(t, h, w, rows.shape[-1]).permute(0, 3, 1, 2)
    pooled = F.avg_pool2d(frames, kernel_size=2, stride=2, ceil_mode=True)
    return pooled.permute(0, 2, 3, 1).reshape(-1, rows.shape[-1]), (t, pooled.shape[2], pooled.shape[3])
