"""A sample's prompt as the loop decodes it: token ids with one placeholder per image, refused as
input (not left to fail inside a model) when it cannot be decoded or does not fit the context."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from PIL import Image

from pipeline.data.sample import Sample
from pipeline.models.base import LVLM, ModelInputError


@dataclass
class Prompt:
    """A tokenized prompt checked for decoding: ids with one placeholder per image."""

    ids: list[int]
    images: Sequence[Image.Image]


def tokenize(model: LVLM, sample: Sample) -> Prompt:
    if sample.error:
        raise ModelInputError(sample.error)
    sample.check()
    check_text_fits(model, sample)
    ids = model.tokenize_prompt(sample.prompt)
    if model.image_token_id is not None and ids[-1] == model.image_token_id:
        raise ModelInputError(f"sample {sample.sample_id}: a prompt must end with text, not an image")
    return Prompt(ids, sample.pixels())


def check_text_fits(model: LVLM, sample: Sample) -> None:
    """A prompt whose text alone needs more tokens than the context holds, refused before it is
    tokenized (a 100 MB line would take the tokenizer minutes): no token covers more characters
    than the vocabulary's longest, so the text needs at least its length over that many."""
    limit, tokenizer = model.max_positions, getattr(model, "tokenizer", None)
    if limit is None or tokenizer is None:
        return
    longest = _longest_token(tokenizer)
    if len(sample.prompt) > limit * longest:
        raise ModelInputError(f"sample {sample.sample_id}: its prompt's {len(sample.prompt):,} characters "
                              f"need more than {len(sample.prompt) // longest:,} tokens (its tokenizer's "
                              f"longest token has {longest} characters); {model.name}'s context holds "
                              f"{limit}")


def _longest_token(tokenizer) -> int:
    """Characters of the vocabulary's longest token (kept on the tokenizer: one pass over it)."""
    longest = getattr(tokenizer, "_longest_token_chars", None)
    if longest is None:
        longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
        tokenizer._longest_token_chars = longest
    return max(longest, 1)


def check_fits(model: LVLM, positions: int, prompt: Prompt) -> None:
    """A prompt and its continuation must fit the model's context: refused as input, not left
    to fail (or to allocate a cache of terabytes) inside the model."""
    limit = model.max_positions
    if limit is not None and positions > limit:
        raise ModelInputError(f"{model.name}: the prompt ({len(prompt.ids)} tokens before image features) "
                              f"and its continuation need {positions} positions; the model's context "
                              f"holds {limit}")
