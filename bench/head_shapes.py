"""An EAGLE-1/2 head of real shape for `bench.real_shapes`' LLaVA target, arranged like it: the
target's residual stream stays near the current token's embedding and its LM head predicts that
token's successor, so a head whose output is the token's own embedding proposes what the target
will. Its `fc` passes the token's embedding and adds a fixed random map of the target's features
before it (the previous token's), which pulls the proposal off about 30% of the time; its
layer's outputs are scaled down as the target's are. Built in memory on the device, in EAGLE's
module (`pipeline.models.heads.eagle`)."""
from __future__ import annotations

import torch
from transformers import LlamaConfig

from bench.real_shapes import RESIDUAL_SCALE
from pipeline.models.heads.draft import HeadDraft
from pipeline.models.heads.eagle import EagleHead
from pipeline.models.hf import HFLlava

# the weight of the feature map giving about 70% agreement at each hidden size (measured with the
# LLaVA vocabulary of 32064 random embeddings: 7B 0.68 at 14, 13B 0.65 at 16; tiny 0.73 at 3)
FEATURE_NOISE = {128: 3.0, 4096: 14.0, 5120: 16.0}


@torch.no_grad()
def build_eagle_head(target: HFLlava, seed: int = 7) -> HeadDraft:
    """An EAGLE head of `target`'s text shape (one layer), on its device and in its dtype."""
    text = target.model.config.text_config
    config = LlamaConfig(
        vocab_size=text.vocab_size, hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
        num_hidden_layers=1, num_attention_heads=text.num_attention_heads,
        num_key_value_heads=text.num_key_value_heads, max_position_embeddings=text.max_position_embeddings,
        rms_norm_eps=text.rms_norm_eps, bias=True)
    torch.manual_seed(seed)
    with torch.device(target.device):
        head = EagleHead(config).to(target.dtype).eval()
        hidden = config.hidden_size
        noise = FEATURE_NOISE[hidden] * torch.randn(hidden, hidden) / hidden ** 0.5
        head.fc.weight.copy_(torch.cat([torch.eye(hidden), noise], 1))
        head.fc.bias.zero_()
    layer = head.layers[0]
    layer.self_attn.o_proj.weight.mul_(RESIDUAL_SCALE)
    layer.mlp.down_proj.weight.mul_(RESIDUAL_SCALE)
    return HeadDraft(head, target, "eagle:head", "eagle")
