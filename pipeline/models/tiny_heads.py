"""Tiny head drafts for tests and the smoke grid, written in their kinds' published layouts and
loaded by the same code as a hub checkpoint (`pipeline.models.heads`).

They draft for the bigram target (`pipeline.models.tiny_ssm`): its greedy next token is a fixed
permutation of its last token, and its last hidden state is the normed embedding of the token,
so a head whose `fc` passes the token's embedding through predicts it exactly. Seeded noise on
`fc`, a small weight on the features before the token and a scaled attention output make the
head disagree with it now and then, depending on the features and the context (tau about 2 at
gamma 5), so blocks accept none, some or all of their proposals, and a head handed the wrong
features or context would accept differently.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, PreTrainedModel

from pipeline.models.heads.eagle import EagleHead

# fc's noise on the token, its weight on the features before it, the attention output's scale
EAGLE_NOISE, EAGLE_FEATURES, EAGLE_ATTENTION = 1.5, 0.6, 6.0


def eagle_config(target: PreTrainedModel) -> LlamaConfig:
    """The head's config as EAGLE writes it: the target's text config, one decoder layer."""
    text = target.config.text_config
    return LlamaConfig(
        vocab_size=text.vocab_size, hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
        num_hidden_layers=1, num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads, max_position_embeddings=text.max_position_embeddings,
        rms_norm_eps=text.rms_norm_eps, bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id,
        pad_token_id=text.pad_token_id, tie_word_embeddings=False, bias=True,
    )


@torch.no_grad()
def build_eagle_head(target: PreTrainedModel, out_dir: Path, seed: int = 5) -> Path:
    """An EAGLE-1/2 head for the bigram `target`, written to `out_dir` in EAGLE's layout."""
    torch.manual_seed(seed)
    config = eagle_config(target)
    head = EagleHead(config).eval()
    hidden = config.hidden_size
    noise = lambda scale: scale * torch.randn(hidden, hidden) / hidden ** 0.5
    head.fc.weight.copy_(torch.cat([torch.eye(hidden) + noise(EAGLE_NOISE), noise(EAGLE_FEATURES)], 1))
    head.fc.bias.zero_()
    layer = head.layers[0]
    layer.self_attn.o_proj.weight.mul_(EAGLE_ATTENTION)
    layer.mlp.down_proj.weight.mul_(0.1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    save_file({name: tensor.contiguous() for name, tensor in head.state_dict().items()},
              out_dir / "model.safetensors")
    return out_dir
