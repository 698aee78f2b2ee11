"""The MLP that maps EfficientNet patch features into SmolLM2's input-embedding space.

LLaVA's projector shape (Linear-GELU-Linear, 1280 -> 576 -> 576) with two fixed additions
found in training: the input is standardised per channel (EfficientNet's ReLU6 outputs are
mostly 0 with rare large values), and each output vector is rescaled to the mean norm of the
language model's token embeddings, so image tokens sit at the scale the frozen LM expects.
The same projector reads full (49) and 2x2-pooled (16) tokens: it was trained on both.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

FEATURE_DIM = 1280
HIDDEN_DIM = 576


class Projector(torch.nn.Module):
    def __init__(self, feature_dim: int = FEATURE_DIM, hidden_dim: int = HIDDEN_DIM) -> None:
        super().__init__()
        self.register_buffer("feature_mean", torch.zeros(feature_dim))
        self.register_buffer("feature_std", torch.ones(feature_dim))
        self.register_buffer("output_norm", torch.tensor(1.0))
        self.fc1 = torch.nn.Linear(feature_dim, hidden_dim)
        self.fc2 = torch.nn.Linear(hidden_dim, hidden_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """`[..., 1280]` patch features -> `[..., 576]` input embeddings."""
        x = (features - self.feature_mean) / self.feature_std
        y = self.fc2(F.gelu(self.fc1(x)))
        return F.normalize(y, dim=-1) * self.output_norm

    def save(self, path: Path) -> None:
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, str(path))

    @classmethod
    def load(cls, path: Path) -> "Projector":
        if not Path(path).is_file():
            raise FileNotFoundError(f"projector weights {path} are missing: run scripts/train_embedded.py")
        state = load_file(str(path))
        projector = cls(hidden_dim=state["fc2.weight"].shape[0])  # the target's 576 or a draft's own width
        projector.load_state_dict(state)
        return projector.eval().requires_grad_(False)
