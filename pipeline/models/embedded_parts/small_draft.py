"""The small embedded draft's shape: a narrow Llama over SmolLM2's tokenizer.

4 layers, 128 wide (4 heads, 2 key/value heads), tied embeddings over the same 49152 tokens
as the target, and its own projector (1280 -> 128 -> 128) on the same EfficientNet-Lite0
features. About 7.1M parameters, shipped in fp16 (14 MB); the target has 135M. On a CPU one
step costs about a tenth of the target's, most of it the LM head over the vocabulary.
`scripts/train_small_draft.py` distils it from the target; `pipeline.models.embedded` loads it.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PretrainedConfig

from pipeline.models.embedded_parts.projector import Projector

HIDDEN = 128
LAYERS = 4
HEADS = 4
KV_HEADS = 2
PROJECTOR_NAME = "projector.safetensors"


def small_draft_config(target: PretrainedConfig) -> LlamaConfig:
    """The draft's config: the target's vocabulary and special tokens, narrow and shallow."""
    return LlamaConfig(
        vocab_size=target.vocab_size, hidden_size=HIDDEN, intermediate_size=3 * HIDDEN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        tie_word_embeddings=True, max_position_embeddings=target.max_position_embeddings,
        rope_parameters=dict(target.rope_parameters), rms_norm_eps=target.rms_norm_eps,
        bos_token_id=target.bos_token_id, eos_token_id=target.eos_token_id, pad_token_id=target.pad_token_id,
    )


def save_small_draft(lm: LlamaForCausalLM, projector: Projector, directory: Path) -> None:
    """The language model in fp16 (what ships, ~14 MB) and the projector in fp32 (0.7 MB)."""
    directory.mkdir(parents=True, exist_ok=True)
    lm.to(torch.float16).save_pretrained(directory)
    projector.save(directory / PROJECTOR_NAME)


def load_small_draft(directory: Path, dtype: torch.dtype) -> tuple[LlamaForCausalLM, Projector]:
    """The shipped draft (eval mode, no gradients) and its projector."""
    if not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(f"the small draft's weights {directory} are missing: run scripts/train_small_draft.py")
    lm = LlamaForCausalLM.from_pretrained(directory, dtype=dtype).eval()
    lm.requires_grad_(False)
    return lm, Projector.load(directory / PROJECTOR_NAME)
