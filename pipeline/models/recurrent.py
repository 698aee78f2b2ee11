"""State-space (Mamba / Mamba2) drafts: a plain `Mamba(2)ForCausalLM` (text drafting: T, C) or a
LLaVA checkpoint whose language model is one (it reads image features like any LLaVA draft:
M, P). Drafts only: a recurrent model cannot read a token tree in one forward, which verifying
needs.

What transformers (5.x) does with these models, measured, and what this adapter does about it:
- The state lives in `DynamicCache(config=...)`: one `LinearAttentionLayer` per layer holding
  a conv state and a recurrent state, updated in place, never cropped. The engine rolls back by
  restoring saved states (`pipeline.decoding.state_rows`); `state_tensors` is the one place
  that reads those non-public fields (`tests/test_state_rows.py` is the canary).
- The cache goes in as `cache=`; `past_key_values=` is silently ignored.
- A 4-D attention mask makes Mamba raise and is silently dropped by Mamba2: rows pass the 2-D
  0/1 padding mask instead (left padding is then exact).
- Mamba (v1)'s multi-token forward after a prefill restarts its state from zero (a 0.04 logit
  error in fp32 and fp64): after the prefill the rows feed one token per forward.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import Cache, DynamicCache, PreTrainedModel

from pipeline.models.base import ModelInputError, StepLog
from pipeline.models.hf import HFLlava, HFModel

RECURRENT = "linear_attention"  # transformers' layer type of a state-space layer


def layer_kinds(config: Any) -> set[str]:
    """The layer types of a loaded checkpoint config's language model (`text_config` for a
    LLaVA one); empty for an ordinary attention model."""
    text = getattr(config, "text_config", None) or config
    return set(getattr(text, "layer_types", None) or ())


def is_recurrent(config: Any) -> bool:
    """Every layer of the language model is a state-space layer (Mamba, Mamba2)."""
    return layer_kinds(config) == {RECURRENT}


def is_hybrid(config: Any) -> bool:
    """State-space and attention layers mixed (Jamba, Zamba2, ...): state and KV rollback at
    once, which this engine does not do."""
    kinds = layer_kinds(config)
    return RECURRENT in kinds and len(kinds) > 1


class RecurrentMixin:
    """What a recurrent language model changes in an `HFModel`: its cache, its forward (cache
    in as `cache=`, a 2-D padding mask, the head applied to the kept positions only) and the
    state the rows save and restore."""

    recurrent = True
    drafter = "state"
    language_model: torch.nn.Module
    lm_head: torch.nn.Module
    text_config: Any

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.text_config)

    def state_tensors(self, cache: Cache) -> list[torch.Tensor]:
        """Every state tensor of the cache, layer by layer (conv, then recurrent): what a
        rollback restores. Empty before the first forward writes them."""
        found = []
        for layer in cache.layers:
            found += [t for t in (*layer.conv_states.values(), *layer.recurrent_states.values())
                      if t is not None]
        return found

    def replace_states(self, cache: Cache, states: list[torch.Tensor]) -> None:
        """Put `states` (as `state_tensors` lists them, any row count) in the cache's place."""
        found = iter(states)
        for layer in cache.layers:
            for held in (layer.conv_states, layer.recurrent_states):
                for index, tensor in held.items():
                    if tensor is not None:
                        held[index] = next(found)

    @torch.inference_mode()
    def logits(self, *, cache: Cache, attention_mask: torch.Tensor | None,
               position_ids: torch.Tensor | None = None, input_ids: torch.Tensor | None = None,
               inputs_embeds: torch.Tensor | None = None, keep: int = 1, compiled: bool = False,
               steps: StepLog | None = None, hidden: tuple[int, ...] = ()) -> torch.Tensor:
        """fp32 logits of the last `keep` positions; `attention_mask`: None or `[B, L]` 0/1
        (positions are implicit in a recurrence)."""
        if hidden:
            raise ModelInputError(f"{self.name}: a state-space model only drafts; "
                                  "it gives no verify hidden states")
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ModelInputError(f"{self.name}: a recurrent model takes a 2-D padding mask, not a "
                                  f"{attention_mask.dim()}-D attention mask")
        ids = None if input_ids is None else input_ids.to(self.device)
        out = self.language_model(input_ids=ids, inputs_embeds=inputs_embeds, cache=cache, use_cache=True,
                                  attention_mask=attention_mask)
        # the slow CPU paths may return it upcast, as Mamba's own head expects
        hidden = out.last_hidden_state[:, -keep:]
        return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()


class RecurrentLM(RecurrentMixin, HFModel):
    """A `Mamba(2)ForCausalLM`: text drafting (T, C) only."""

    def __init__(self, model: PreTrainedModel, tokenizer, name: str) -> None:
        super().__init__(model, tokenizer, name)
        self.language_model, self.lm_head, self.text_config = model.backbone, model.lm_head, model.config


class RecurrentLlava(RecurrentMixin, HFLlava):
    """A LLaVA checkpoint with a Mamba or Mamba2 language model: its vision tower and projector
    give the image features (M, P) exactly as for an attention LLaVA draft."""

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor, name)
        self.language_model, self.lm_head = model.model.language_model, model.lm_head
        self.text_config = model.config.text_config
