"""The small embedded draft's shape: a narrow Llama over SmolLM2's tokenizer.

4 layers, 128 wide (4 heads, 2 key/value heads), tied embeddings over the same 49152 tokens
as the target, and its own projector (1280 -> 128 -> 128) on the same EfficientNet-Lite0
features. About 7.1M parameters, shipped in fp16 (14 MB); the target has 135M.

It reads every token but proposes only from an output vocabulary (`output_vocabulary.json`):
the tokens of its training answers and SmolLM2's 8192 first ids, its commonest BPE pieces,
about 9k of 49152. The head over the whole vocabulary was about two thirds of a draft step
on a CPU; over the subset a step costs a third as much, and the logits of the kept tokens are
the full head's, so proposals change only where the full head's choice lay outside the subset.
`scripts/train_small_draft.py` distils it from the target; `pipeline.models.embedded` loads it.
`--arch mamba2` trains its state-space sibling (`embedded:ssm_draft`, `ssm_draft_config`) the
same way, with the same head and projector.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import torch
from transformers import (
    LlamaConfig, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM, PretrainedConfig, PreTrainedModel,
)

from pipeline.models.embedded_parts.projector import Projector

HIDDEN = 128
LAYERS = 4
HEADS = 4
KV_HEADS = 2
PROJECTOR_NAME = "projector.safetensors"
VOCABULARY_NAME = "output_vocabulary.json"
COMMON_TOKENS = 8192  # SmolLM2's first ids: BPE numbers its merges commonest first


class OutputVocabularyHead(torch.nn.Module):
    """The LM head restricted to the tokens the draft may propose. It returns logits over the
    whole vocabulary, -inf outside the subset, so mixing, verification and the TABED history
    see the same shapes as with any draft."""

    def __init__(self, weight: torch.Tensor, token_ids: torch.Tensor) -> None:
        super().__init__()
        self.vocab_size = weight.shape[0]
        self.register_buffer("token_ids", token_ids.to(device=weight.device, dtype=torch.long))
        self.register_buffer("weight", weight.detach()[self.token_ids].clone())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden.new_full((*hidden.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.token_ids, hidden @ self.weight.T)


def output_vocabulary(answers: Iterable[Iterable[int]], common: int = COMMON_TOKENS) -> list[int]:
    """The ids the draft may propose: every token of its training answers and the `common` first ids."""
    ids = set(range(common))
    for answer in answers:
        ids.update(answer)
    return sorted(ids)


def small_draft_config(target: PretrainedConfig) -> LlamaConfig:
    """The draft's config: the target's vocabulary and special tokens, narrow and shallow."""
    return LlamaConfig(
        vocab_size=target.vocab_size, hidden_size=HIDDEN, intermediate_size=3 * HIDDEN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        tie_word_embeddings=True, max_position_embeddings=target.max_position_embeddings,
        rope_parameters=dict(target.rope_parameters), rms_norm_eps=target.rms_norm_eps,
        bos_token_id=target.bos_token_id, eos_token_id=target.eos_token_id, pad_token_id=target.pad_token_id,
    )


def save_small_draft(lm: PreTrainedModel, projector: Projector, directory: Path,
                     vocabulary: list[int]) -> None:
    """The language model in fp16 (what ships, ~14 MB), the projector in fp32 (0.7 MB) and the
    output vocabulary (ids)."""
    directory.mkdir(parents=True, exist_ok=True)
    lm.to(torch.float16).save_pretrained(directory)
    projector.save(directory / PROJECTOR_NAME)
    save_vocabulary(vocabulary, directory)


def save_vocabulary(vocabulary: list[int], directory: Path) -> None:
    (directory / VOCABULARY_NAME).write_text(json.dumps(vocabulary) + "\n")


def ssm_draft_config(target: PretrainedConfig) -> Mamba2Config:
    """The state-space draft's config (`embedded:ssm_draft`): a Mamba2 of the small draft's
    width and depth (state 64, 8 heads of 32), tied embeddings over the target's vocabulary:
    about 6.8M parameters, the small Llama draft's 7.1M."""
    return Mamba2Config(
        vocab_size=target.vocab_size, hidden_size=HIDDEN, num_hidden_layers=LAYERS, state_size=64, expand=2,
        head_dim=32, num_heads=2 * HIDDEN // 32, n_groups=1, chunk_size=64, tie_word_embeddings=True,
        bos_token_id=target.bos_token_id, eos_token_id=target.eos_token_id, pad_token_id=target.pad_token_id,
    )


ARCHITECTURES = {"llama": (small_draft_config, LlamaForCausalLM),
                 "mamba2": (ssm_draft_config, Mamba2ForCausalLM)}


def load_small_draft(directory: Path, dtype: torch.dtype,
                     arch: str = "llama") -> tuple[PreTrainedModel, Projector]:
    """A shipped draft of `arch` (eval mode, no gradients) and its projector."""
    if not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(f"the draft's weights {directory} are missing: "
                                f"run scripts/train_small_draft.py --arch {arch}")
    lm = ARCHITECTURES[arch][1].from_pretrained(directory, dtype=dtype).eval()
    lm.requires_grad_(False)
    vocabulary = json.loads((directory / VOCABULARY_NAME).read_text())
    lm.lm_head = OutputVocabularyHead(lm.get_input_embeddings().weight, torch.tensor(vocabulary))
    return lm, Projector.load(directory / PROJECTOR_NAME)
