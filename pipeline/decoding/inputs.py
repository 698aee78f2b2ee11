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
    ids = model.tokenize_prompt(sample.prompt)
    if model.image_token_id is not None and ids[-1] == model.image_token_id:
        raise ModelInputError(f"sample {sample.sample_id}: a prompt must end with text, not an image")
    return Prompt(ids, sample.pixels())


def check_fits(model: LVLM, positions: int, prompt: Prompt) -> None:
    """A prompt and its continuation must fit the model's context: refused as input, not left
    to fail (or to allocate a cache of terabytes) inside the model."""
    limit = model.max_positions
    if limit is not None and positions > limit:
        raise ModelInputError(f"{model.name}: the prompt ({len(prompt.ids)} tokens before image features) "
                              f"and its continuation need {positions} positions; the model's context "
                              f"holds {limit}")
