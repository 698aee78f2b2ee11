"""Tiny state-space drafts for tests and the smoke grid, and the tiny target they are built to follow.

- `bigram_target`: a LLaVA-1.5 (the tiny target's architecture and tokenizer) whose layers add
  nothing to the residual stream and whose head is set so that its greedy next token is a
  fixed permutation of its last token: a target a tiny draft can predict. (The tiny target's
  greedy outputs are a random function of the whole context: a distilled 2-layer Mamba agreed
  with it on 3-6% of tokens, too few accepted proposals to exercise roll-backs.)
- `mamba_draft`, `mamba2_draft`: LLaVA checkpoints whose language model is a 2-layer Mamba or
  Mamba2 (`pipeline.models.recurrent`), with the bigram target's vision tower, projector,
  embeddings and head, and a seeded Mamba body whose output is scaled so that its state moves
  the prediction away from the rule about a quarter of the time: on the bigram target's own
  greedy continuations they agree with it on about 73% of tokens, so blocks accept none, some
  or all of their proposals, and a state restored wrongly changes what is accepted.
Seeded: every node builds the same weights; no training, so a build takes seconds.
"""
from __future__ import annotations

import torch
from transformers import (
    LlavaConfig, LlavaForConditionalGeneration, Mamba2Config, MambaConfig, PreTrainedModel,
    PreTrainedTokenizerFast,
)

KINDS = ("mamba", "mamba2")
# scale of each Mamba block's output: about 73% agreement with the bigram target (measured on
# 16 random prompts' greedy continuations: Mamba 0.84 at 6, 0.62 at 8; Mamba2 0.85 at 0.7, 0.74 at 0.8)
MIXER_SCALE = {"mamba": 7.0, "mamba2": 0.8}


def text_config(kind: str, tokenizer: PreTrainedTokenizerFast, hidden: int) -> MambaConfig | Mamba2Config:
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=2,
                  tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    if kind == "mamba":
        return MambaConfig(state_size=8, expand=2, conv_kernel=4, **common)
    return Mamba2Config(state_size=16, expand=2, n_groups=1, head_dim=16, num_heads=2 * hidden // 16,
                        chunk_size=16, **common)


@torch.no_grad()
def make_bigram_target(target: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                       seed: int = 4) -> PreTrainedModel:
    """`target` (a fresh tiny LLaVA, or a tiny model of another family) turned into one whose
    greedy next token is a seeded permutation of its last token; special tokens are never
    predicted. Its final norm scales every dimension alike (Gemma's norm multiplies by 1 + its
    weight), so its last hidden state is the token's normed embedding."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.arange(len(tokenizer))
    words = ids[~torch.isin(ids, torch.tensor(tokenizer.all_special_ids))]
    follows = words[torch.randperm(len(words), generator=generator)]  # the token after words[i]
    language = target.model.language_model
    for layer in language.layers:  # the residual stream keeps the token's embedding
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    language.norm.weight.fill_(0.0 if type(language.norm).__name__.startswith("Gemma") else 1.0)
    normed = language.norm(language.embed_tokens.weight[words])
    target.lm_head.weight.zero_()
    target.lm_head.weight[follows] = normed  # the logit of follows[i] is largest exactly after words[i]
    return target.eval()


@torch.no_grad()
def build_ssm_draft(kind: str, tokenizer: PreTrainedTokenizerFast, target: LlavaForConditionalGeneration,
                    seed: int = 3) -> LlavaForConditionalGeneration:
    """A LLaVA draft with a `kind` language model that follows `target` (a bigram target) where
    its state does not pull it elsewhere."""
    torch.manual_seed(seed)
    config = LlavaConfig(
        vision_config=target.config.vision_config,
        text_config=text_config(kind, tokenizer, target.config.text_config.hidden_size),
        image_token_index=target.config.image_token_id,
        vision_feature_layer=target.config.vision_feature_layer,
        vision_feature_select_strategy=target.config.vision_feature_select_strategy,
    )
    draft = LlavaForConditionalGeneration(config)
    draft.model.vision_tower.load_state_dict(target.model.vision_tower.state_dict())
    draft.model.multi_modal_projector.load_state_dict(target.model.multi_modal_projector.state_dict())
    language = draft.model.language_model
    language.get_input_embeddings().weight.copy_(target.model.language_model.embed_tokens.weight)
    language.norm_f.weight.fill_(1.0)
    draft.lm_head.weight.copy_(target.lm_head.weight)
    for layer in language.layers:
        layer.mixer.out_proj.weight.mul_(MIXER_SCALE[kind])
    return draft.eval()
