"""Drafting methods (docs/algorithm.md §2): how one prompt becomes the draft's input row.

A method is a `DraftingMethod` subclass registered under one capital letter, which is how
grid files and result rows name it inside method sets (`MT` = M and T as two rows of one
batch). The built-in M (multimodal), T (text-only), C (caption) and P (pooled image) are
defined here the same way a user's method is:

    class Grayscale(DraftingMethod, letter="G"):
        '''M on grayscale pixels.'''
        def embeddings(self, model, ids, images, captions):
            gray = [image.convert("L").convert("RGB") for image in images]
            return splice(model, ids, model.image_features(gray) if gray else [])

Prompts arrive as token ids with ONE placeholder id per image; `embeddings` returns the row's
input embeddings `[L, hidden]`, splicing image feature rows (or token ids) in where the method
keeps pixels (`splice`). Torch is imported only when a method runs, so grid files validate
without it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Sequence

from PIL import Image

from pipeline.models.families import FAMILIES, TEXT_DRAFTS
from pipeline.registry import Registry

if TYPE_CHECKING:
    import torch

    from pipeline.models.base import LVLM

CAPTION_PREFIX = "image: "  # paper Appendix I.2
RESERVED_LETTERS = "AR"  # "AR" names the autoregressive baseline, not a method set
# letter -> method (an instance), in registration order (M, T, C, P first)
METHODS = Registry("drafting method letter")


class DraftingMethod:
    """Base of every drafting method. `needs_captions`: `embeddings` gets one caption per
    image (the grid must name a captioner); `refused_draft_kinds`: draft model types it
    cannot run on (checked when the grid is read)."""

    letter: ClassVar[str] = ""
    name: ClassVar[str] = ""  # a word for listings and errors (default: the class name, lower case)
    needs_captions: ClassVar[bool] = False
    refused_draft_kinds: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, letter: str = "", **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not letter:
            return
        if len(letter) != 1 or not letter.isupper() or letter in RESERVED_LETTERS:
            raise ValueError(f"drafting method {cls.__qualname__}: letter must be one capital letter other "
                             f"than {' or '.join(RESERVED_LETTERS)}, got {letter!r}")
        cls.letter = letter
        cls.name = cls.__dict__.get("name") or cls.__name__.lower()
        METHODS.add(letter, cls())

    @property
    def description(self) -> str:
        """One line for `--list methods`: the class docstring's first line."""
        return (type(self).__doc__ or type(self).__qualname__).strip().splitlines()[0]

    def embeddings(
        self, model: LVLM, ids: Sequence[int], images: Sequence[Image.Image], captions: Sequence[str] | None
    ) -> torch.Tensor:
        raise NotImplementedError


def check_methods(methods: str) -> None:
    """ValueError naming unknown or repeated letters of a method set."""
    if not methods:
        raise ValueError("methods must name at least one drafting method")
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        known = ", ".join(f"{letter} ({m.name})" for letter, m in METHODS.items())
        raise ValueError(f"unknown drafting method letter(s) {unknown} in {methods!r}; known: {known}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"drafting method repeated in {methods!r}")


def method_order(methods: str) -> tuple[int, ...]:
    """Registration order of each letter (tables list M, T, C, P, then user methods)."""
    order = list(METHODS)
    return tuple(order.index(m) if m in order else len(order) for m in methods)


def needs_captions(methods: str) -> bool:
    return any(METHODS[m].needs_captions for m in methods if m in METHODS)


def placeholder_positions(model: LVLM, ids: Sequence[int], n_images: int) -> list[int]:
    """Indices of the image placeholders; raises when their count differs from the images'."""
    from pipeline.models.base import ModelInputError

    image = model.image_token_id
    positions = [i for i, t in enumerate(ids) if image is not None and t == image]
    if len(positions) != n_images:
        raise ModelInputError(
            f"prompt has {len(positions)} image placeholder(s) but {n_images} image(s) were given"
        )
    return positions


def splice(model: LVLM, ids: Sequence[int], pieces: Sequence[torch.Tensor | list[int]]) -> torch.Tensor:
    """Embeddings of `ids` with the i-th placeholder replaced by `pieces[i]`: feature rows
    `[k, hidden]` or a list of token ids."""
    import torch

    positions = placeholder_positions(model, ids, len(pieces))
    parts, start = [], 0
    for pos, piece in zip(positions, pieces):
        parts.append(list(ids[start:pos]))
        parts.append(piece)
        start = pos + 1
    parts.append(list(ids[start:]))
    parts = [part for part in parts if len(part)]
    embedded = [
        part.to(model.device, model.dtype) if isinstance(part, torch.Tensor)
        else model.embed_tokens(torch.tensor(part, dtype=torch.long))
        for part in parts
    ]
    return model.spliced(torch.cat(embedded, dim=0), parts)


def newline_token_id(model: LVLM) -> int:
    """The single token for "\\n" that replaces an image in text-only drafting."""
    from pipeline.models.base import ModelInputError

    for token in model.tokenizer.encode("\n", add_special_tokens=False):
        if model.tokenizer.decode([token]) == "\n":
            return token
    raise ModelInputError(f"{model.name}: the tokenizer has no single token for a newline")


class Multimodal(DraftingMethod, letter="M"):
    """M: the draft sees the image features, like the target."""

    name = "multimodal"
    refused_draft_kinds = tuple(TEXT_DRAFTS)  # text-only drafts: no image features

    def embeddings(self, model, ids, images, captions):
        return splice(model, ids, model.image_features(images) if images else [])


class TextOnly(DraftingMethod, letter="T"):
    """T: each image replaced by a newline; the draft reads the text alone."""

    name = "text-only"

    def embeddings(self, model, ids, images, captions):
        return splice(model, ids, [[newline_token_id(model)]] * len(images))


class Caption(DraftingMethod, letter="C"):
    """C: each image replaced by its caption from the grid's captioner."""

    name = "caption"
    needs_captions = True

    def embeddings(self, model, ids, images, captions):
        from pipeline.models.base import ModelInputError

        if captions is None or len(captions) != len(images):
            raise ModelInputError("caption drafting (C) needs one caption per image")
        tokenize = model.tokenizer.encode
        return splice(model, ids, [tokenize(CAPTION_PREFIX + c, add_special_tokens=False) for c in captions])


class Pooled(DraftingMethod, letter="P"):
    """P: image features average-pooled 2x2 over the patch grid (a quarter of the rows)."""

    name = "pooled"
    # families without one patch grid per image to pool (tiles: LLaVA-NeXT, OneVision, InternVL),
    # and text-only drafts
    refused_draft_kinds = (*(kind for kind, family in FAMILIES.items() if not family.pooling), *TEXT_DRAFTS)

    def embeddings(self, model, ids, images, captions):
        return splice(model, ids, model.image_features(images, pooled=True) if images else [])


def method_embeddings(
    model: LVLM,
    method: str,
    ids: Sequence[int],
    images: Sequence[Image.Image],
    captions: Sequence[str] | None = None,
) -> torch.Tensor:
    """Input embeddings `[L, hidden]` of one prompt under the drafting method lettered `method`."""
    if method not in METHODS:
        from pipeline.models.base import ModelInputError

        raise ModelInputError(f"unknown drafting method {method!r}; known: {', '.join(METHODS)}")
    return METHODS[method].embeddings(model, ids, images, captions)


class LookupMember(DraftingMethod, letter="L"):
    """L: the pair's draft-free lookup, beside the draft model's own methods, for a draft named
    `<draft>+<lookup>` (`pipeline.models.mixed_draft`): `ML` mixes the draft's M with the lookup."""

    name = "lookup"

    def embeddings(self, model, ids, images, captions):
        from pipeline.models.base import ModelInputError

        lookup = getattr(model, "lookup", None)
        if lookup is None:
            raise ModelInputError(f"{model.name}: lookup drafting (L) needs a draft named <draft>+<lookup>, "
                                  "e.g. embedded:small_draft+pld")
        return splice(lookup, ids, lookup.image_features(images) if images else [])
