"""EAGLE-3's head, in the layout its reference code writes (SafeAILab/EAGLE `cnets.py`), and the
speculators format's rename of it:

- `config.json`: a `LlamaConfig` of one layer (`LlamaForCausalLMEagle3`), `draft_vocab_size`
  (its own output vocabulary, the target's commonest tokens), optionally `target_hidden_size`,
  `bias` (of `fc`; default none) and the target layers it reads
  (`eagle_aux_hidden_state_layer_ids`; default `2, L // 2, L - 3` of an L-layer target). The
  speculators format nests the layer's config as `transformer_layer_config` beside those keys.
- weights: `fc.weight` `[H, 3 H_target]`; `midlayer.self_attn.{q,k,v}_proj.weight` `[*, 2H]` and
  `o_proj`; `midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight`;
  `midlayer.mlp.{gate,up,down}_proj.weight`; `norm.weight`; `lm_head.weight` `[V_draft, H]`;
  `d2t` (int64, `[V_draft]`: draft id i is target id i + d2t[i]) and `t2d` (bool, `[V]`), both
  left out when the two vocabularies are one. Speculators names the layer `layers.0.` instead
  of `midlayer.`; an `embed_tokens.weight` copy of the target's is not read.

At a token the head reads the target's hidden states at three layers before it (the inputs of
those decoder layers), side by side, through `fc`; its one layer attends over
`[input_layernorm(embedding); hidden_norm(fc's output)]` and adds to `fc`'s output. Drafting on,
the head's own output (before its final norm) is the next token's state, read without `fc`.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import Cache, LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaAttention, LlamaMLP, LlamaPreTrainedModel, LlamaRMSNorm,
)

from pipeline.models.heads.prompt import FusesPrompts
from pipeline.models.heads.rotary import head_rotary, reads_target_positions

SPECULATORS_LAYER = "layers.0."  # speculators' name for what EAGLE's code calls `midlayer.`


def default_layers(target_layers: int) -> tuple[int, int, int]:
    """The target layers EAGLE-3 reads when its config names none: inputs of layers 2, L//2, L-3."""
    return 2, target_layers // 2, target_layers - 3


class Eagle3Layer(nn.Module):
    """The one decoder layer: attention over `[embedding; state]` (2H wide), the state's residual."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):  # they read the embedding and the state side by side
            plain = getattr(self.self_attn, name)
            wide = nn.Linear(2 * hidden, plain.out_features, bias=plain.bias is not None)
            setattr(self.self_attn, name, wide)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.norm_before_residual = getattr(config, "norm_before_residual", False)

    def forward(self, embeds: torch.Tensor, states: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, cache: Cache, position_embeddings: tuple) -> torch.Tensor:
        normed = self.hidden_norm(states)
        residual = normed if self.norm_before_residual else states
        attended, _ = self.self_attn(torch.cat([self.input_layernorm(embeds), normed], -1),
                                     attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                                     use_cache=True, position_embeddings=position_embeddings)
        states = residual + attended
        return states + self.mlp(self.post_attention_layernorm(states))


class Eagle3Head(FusesPrompts, LlamaPreTrainedModel):
    """`fc`, the layer, the final norm and the head's own LM head over its draft vocabulary."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        target_hidden = getattr(config, "target_hidden_size", None) or hidden
        drafted = getattr(config, "draft_vocab_size", None) or config.vocab_size
        self.fc = nn.Linear(3 * target_hidden, hidden, bias=bool(getattr(config, "bias", False)))
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, drafted, bias=False)
        self.register_buffer("d2t", torch.zeros(drafted, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        self.rotary_emb = head_rotary(config)
        self.target_positions = reads_target_positions(config)
        self.target_layers = tuple(getattr(config, "eagle_aux_hidden_state_layer_ids", None) or ())
        self.post_init()

    def fuse(self, embeds: torch.Tensor, features: torch.Tensor,
             summary: torch.Tensor | None = None) -> torch.Tensor:
        """`[embedding; state]` rows: the target's three states go through `fc`, the head's own do
        not."""
        states = features.to(embeds.dtype)
        if states.shape[-1] != embeds.shape[-1]:
            states = self.fc(states)
        return torch.cat([embeds, states], -1)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                cache: Cache) -> torch.Tensor:
        embeds, states = inputs_embeds.chunk(2, -1)
        position_embeddings = self.rotary_emb(states, position_ids=position_ids)
        return self.midlayer(embeds, states, attention_mask, position_ids, cache, position_embeddings)

    def next_logits(self, states: torch.Tensor, target_head: nn.Module) -> torch.Tensor:
        """Logits over the target's vocabulary: the draft vocabulary's mapped through `d2t`, every
        other token ruled out."""
        drafted = self.lm_head(self.norm(states)).float()
        logits = drafted.new_full((*drafted.shape[:-1], self.t2d.shape[0]), torch.finfo(drafted.dtype).min)
        ids = torch.arange(drafted.shape[-1], device=drafted.device) + self.d2t
        return logits.index_copy_(-1, ids, drafted)
