"""EAGLE-1/2's head, in the layout its reference code writes (SafeAILab/EAGLE `cnets1.py`):

- `config.json`: a `LlamaConfig` of one decoder layer (`num_hidden_layers: 1`) at the target's
  hidden size; an optional `bias` key says whether `fc` has a bias (default: it has);
- weights (`model.safetensors` or `pytorch_model.bin`): `fc.weight` `[H, 2H]` (and `fc.bias`),
  then `layers.0.self_attn.{q,k,v,o}_proj.weight`, `layers.0.mlp.{gate,up,down}_proj.weight`
  and `layers.0.post_attention_layernorm.weight`. Layer 0 has no input norm, the head has no
  final norm and no LM head; an `embed_tokens.weight` some checkpoints carry is a copy of the
  target's and is not read.

At a token `x_p` the head reads `fc([embed(x_p); f_{p-1}])`, where `f_{p-1}` is the target's
last hidden state (after its final norm) at the position before, and its one layer predicts
`f_p`; the target's own LM head turns that into the next token's logits. Drafting on, the head
feeds its own prediction back as the next token's `f`. EAGLE-2 is the same head drafting a
dynamic tree (verify kind `eagle2`).
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import Cache, LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer, LlamaPreTrainedModel,
)

from pipeline.models.base import LAST_HIDDEN
from pipeline.models.heads.prompt import FusesPrompts
from pipeline.models.heads.rotary import head_rotary, reads_target_positions


class EagleHead(FusesPrompts, LlamaPreTrainedModel):
    """The head's own weights: `fc` and one decoder layer; `fuse` makes a token's input row,
    `forward` runs the rows over the head's KV cache and returns the predicted features."""

    #: the target's hidden states the head reads (`LVLM.logits(hidden=...)`)
    target_layers: tuple[int, ...] = (LAST_HIDDEN,)
    #: whether its layer rotates by the target's positions (M-RoPE's), not plain indices
    target_positions: bool = False

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=getattr(config, "bias", True))
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, 0)])
        self.layers[0].input_layernorm = nn.Identity()  # the layer reads fc's output as it is
        self.rotary_emb = head_rotary(config)
        self.target_positions = reads_target_positions(config)
        self.post_init()

    def fuse(self, embeds: torch.Tensor, features: torch.Tensor,
             summary: torch.Tensor | None = None) -> torch.Tensor:
        """Input rows from token embeddings and the features before each token, `[..., H]` each
        (`summary`: ViSpec's image summary, which EAGLE has none of)."""
        return self.fc(torch.cat([embeds, features.to(embeds.dtype)], -1))

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                cache: Cache) -> torch.Tensor:
        """The predicted features after each fused row `[B, n, H]` (the engine's 4-D additive mask)."""
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)
        states = inputs_embeds
        for layer in self.layers:
            states = layer(states, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                           use_cache=True, position_embeddings=position_embeddings)
        return states

    def next_logits(self, states: torch.Tensor, target_head: nn.Module) -> torch.Tensor:
        """fp32 logits of the token after each state: the target's own LM head reads them."""
        return target_head(states.to(target_head.weight.dtype)).float()
