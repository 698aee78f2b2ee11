"""What the tiny models of every family share: the word list their BPE tokenizers are trained
on (deterministic), silenced special tokens, the draft as a noisy copy of its target, and saving
a processor's parts side by side."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

_WORDS = (
    "the a an image picture photo shows red blue green yellow circle square triangle cat dog man "
    "woman street car tree sky table what is in this describe detail please explain why how many "
    "user assistant question answer first second difference source target instruction story end "
    "caption left right top bottom color shape small large there are and of on with to for it"
).split()


def trained_bpe(special_tokens: list[str], vocab_size: int = 384) -> Tokenizer:
    """A byte-level BPE with `special_tokens` first, trained on a fixed word list (deterministic)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(_WORDS[i:] + _WORDS[:i]) + "\nUSER: ASSISTANT: 0123456789."
              for i in range(len(_WORDS))]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def silence_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                           special_tokens: list[str]) -> PreTrainedModel:
    """Zero the output rows of special tokens other than EOS: their logit is then 0 while some
    of the hundreds of random logits is almost surely larger, so a random model never emits an
    image or turn token (which a real one never does either, and transformers' assisted
    generation cannot handle as a candidate)."""
    silent = [tokenizer.convert_tokens_to_ids(t) for t in special_tokens if t != tokenizer.eos_token]
    with torch.no_grad():
        model.lm_head.weight[silent] = 0
    return model


def perturbed_copy(model: PreTrainedModel, noise: float, seed: int) -> PreTrainedModel:
    """The same model with Gaussian noise (relative to each tensor's std) on every weight."""
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            scale = param.std() if param.numel() > 1 else param.abs()
            param.add_(torch.randn(param.shape, generator=gen) * scale * noise)
    return copy


class SavedSeparately:
    """Image processor and tokenizer saved side by side: `LlavaOnevisionProcessor` and
    `Qwen2_5_VLProcessor` also want a video processor, which needs torchvision (not installed
    here); loading falls back alike (`pipeline.models.loading.ImageTextProcessor`)."""

    def __init__(self, *parts) -> None:
        self.parts = parts

    def save_pretrained(self, path: Path) -> None:
        for part in self.parts:
            part.save_pretrained(path)


class ProcessorConfig:
    """A processor's `processor_config.json` written alone, for a processor that cannot be built
    here (it wants torchvision): what its class reads when it can be (image tokens per tile)."""

    def __init__(self, values: dict) -> None:
        self.values = values

    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "processor_config.json").write_text(json.dumps(self.values, indent=2) + "\n")
