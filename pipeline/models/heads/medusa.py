"""Medusa's heads (FasterDecoding/Medusa `medusa/model/medusa_model.py`), in the files its code
writes: `config.json` with `medusa_num_heads` (K) and `medusa_num_layers` (J) beside
`base_model_name_or_path`, and the heads' state dict (`medusa_lm_head.pt`, or `.safetensors`):
`{k}.{j}.linear.weight|bias` for head k's J residual blocks (`x + SiLU(Linear(x))`) and
`{k}.{J}.weight` for its projection to the target's vocabulary.

Every head reads the target's last hidden state (after its final norm) at one position t, where
the target's own LM head predicts token t + 1; head k predicts token t + k + 2. A block's
proposals all come from the state before its last pending token: the first proposal from head
0, the next from head 1, and so on, whatever the draft proposed before them. The adapter is
`MedusaDraft`, its rows `pipeline.decoding.medusa_rows` (`drafter = "medusa"`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pipeline.models.base import LAST_HIDDEN


class ResBlock(nn.Module):
    """`x + SiLU(Linear(x))`, Medusa's block (zero-initialised in its training: an identity)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.ModuleList):
    """K heads, each J residual blocks and a projection to the vocabulary; the state dict is the
    published one (a `ModuleList` of `Sequential`s)."""

    target_layers: tuple[int, ...] = (LAST_HIDDEN,)

    def __init__(self, hidden: int, vocab: int, heads: int, layers: int) -> None:
        head = lambda: nn.Sequential(*[ResBlock(hidden) for _ in range(layers)],
                                     nn.Linear(hidden, vocab, bias=False))
        super().__init__([head() for _ in range(heads)])

    @classmethod
    def of_config(cls, config: dict[str, Any], target_text: dict[str, Any]) -> MedusaHeads:
        """The heads a Medusa `config.json` names, at the target's hidden size and vocabulary."""
        return cls(target_text["hidden_size"], target_text["vocab_size"], config["medusa_num_heads"],
                   config["medusa_num_layers"])

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """`[B, K, V]` fp32 logits of every head from the states `[B, H]`."""
        return torch.stack([head(states) for head in self], 1).float()
