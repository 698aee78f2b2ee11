"""The rotary tables of a head's layer. A head trained on a Qwen-VL target's M-RoPE positions
names them in its config as SpecForge writes it (`rope_scaling: {type: mrope, mrope_section:
[16, 24, 24]}` for Qwen2.5-VL; `{rope_type: default, mrope_section: [24, 20, 20],
mrope_interleaved: true}` for Qwen3-VL): it rotates each row by the target's three position
coordinates, merged by section as its target does (transformers' own Qwen2.5-VL and Qwen3-VL
rotary classes). Any other head rotates by plain sequence indices (EAGLE's, ViSpec's code)."""
from __future__ import annotations

from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding


def reads_target_positions(config: LlamaConfig) -> bool:
    """Whether a head's config names M-RoPE sections: it rotates by the target's positions."""
    return "mrope_section" in (getattr(config, "rope_parameters", None) or {})


def head_rotary(config: LlamaConfig) -> nn.Module:
    """`(x, position_ids) -> (cos, sin)` for the head's layer: M-RoPE's where its config names
    sections (position ids `[3, B, L]`, or `[B, L]` for text, every axis alike), else plain."""
    if not reads_target_positions(config):
        return LlamaRotaryEmbedding(config=config)
    rope = config.rope_parameters
    config.rope_parameters = {**rope, "rope_type": "default"}  # `mrope` names a layout, not a scaling
    interleaved = Qwen3VLTextRotaryEmbedding if rope.get("mrope_interleaved") else Qwen2_5_VLRotaryEmbedding
    return interleaved(config)
