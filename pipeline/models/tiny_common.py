"""What the tiny models of every family share: the word list their BPE tokenizers are trained
on (deterministic), and saving a processor's parts side by side."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


class SavedSeparately:
    """Image processor and tokenizer saved side by side: `LlavaOnevisionProcessor` and
    `Qwen2_5_VLProcessor` also want a video processor, which needs torchvision (not installed
    here); loading falls back alike (`pipeline.models.loading.ImageTextProcessor`)."""

    def __init__(self, *parts) -> None:
        self.parts = parts

    def save_pretrained(self, path: Path) -> None:
        for part in self.parts:
            part.save_pretrained(path)
