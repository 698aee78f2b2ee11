"""Drafting methods (docs/algorithm.md §2): how one prompt becomes the draft's input for M, T, C and P.

Prompts arrive as token ids with ONE placeholder id per image. The functions here return the
row's input embeddings, splicing image feature rows in where the method keeps pixels.
"""
from __future__ import annotations

from typing import Sequence

import torch
from PIL import Image

from pipeline.models.base import LVLM, ModelInputError

CAPTION_PREFIX = "image: "  # paper Appendix I.2


def placeholder_positions(model: LVLM, ids: Sequence[int], n_images: int) -> list[int]:
    """Indices of the image placeholders; raises when their count differs from the images'."""
    positions = [i for i, t in enumerate(ids) if model.image_token_id is not None and t == model.image_token_id]
    if len(positions) != n_images:
        raise ModelInputError(
            f"prompt has {len(positions)} image placeholder(s) but {n_images} image(s) were given"
        )
    return positions


def splice(model: LVLM, ids: Sequence[int], pieces: Sequence[torch.Tensor | list[int]]) -> torch.Tensor:
    """Embeddings of `ids` with the i-th placeholder replaced by `pieces[i]`: feature rows
    `[k, hidden]` or a list of token ids."""
    positions = placeholder_positions(model, ids, len(pieces))
    parts, start = [], 0
    for pos, piece in zip(positions, pieces):
        parts.append(list(ids[start:pos]))
        parts.append(piece)
        start = pos + 1
    parts.append(list(ids[start:]))
    embedded = [
        part.to(model.device, model.dtype) if isinstance(part, torch.Tensor)
        else model.embed_tokens(torch.tensor(part, dtype=torch.long))
        for part in parts
        if len(part)
    ]
    return torch.cat(embedded, dim=0)


def newline_token_id(model: LVLM) -> int:
    """The single token for "\\n" that replaces an image in text-only drafting."""
    for token in model.tokenizer.encode("\n", add_special_tokens=False):
        if model.tokenizer.decode([token]) == "\n":
            return token
    raise ModelInputError(f"{model.name}: the tokenizer has no single token for a newline")


def method_embeddings(
    model: LVLM,
    method: str,
    ids: Sequence[int],
    images: Sequence[Image.Image],
    captions: Sequence[str] | None = None,
) -> torch.Tensor:
    """Input embeddings `[L, hidden]` of one prompt under drafting method `method`."""
    if method == "M":
        return splice(model, ids, model.image_features(images) if images else [])
    if method == "P":
        return splice(model, ids, model.image_features(images, pooled=True) if images else [])
    if method == "T":
        return splice(model, ids, [[newline_token_id(model)]] * len(images))
    if method == "C":
        if captions is None or len(captions) != len(images):
            raise ModelInputError("caption drafting (C) needs one caption per image")
        tokenize = model.tokenizer.encode
        return splice(model, ids, [tokenize(CAPTION_PREFIX + c, add_special_tokens=False) for c in captions])
    raise ModelInputError(f"unknown drafting method {method!r}; known: M, T, C, P")
