"""The immutable unit of work: one prompt (with its images) of one dataset row and turn."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

from PIL import Image

IMAGE_PLACEHOLDER = "<image>"
FIRST_TURN = "first"  # a Sample's turn when it opens the conversation


@dataclass(frozen=True)
class Sample:
    """One prompt as the target sees it.

    `prompt` is the whole conversation text WITHOUT the BOS token (the tokenizer adds it),
    e.g. ``"USER: <image>\\nWhat is shown? ASSISTANT:"``; each `<image>` stands for one entry
    of `images`, in order. `error` is set (and `images` may be empty) when the row could not
    be turned into a prompt: the caller records the sample as failed and goes on.
    """

    dataset: str
    split: str
    row: int
    turn: str  # "first" or a second-turn task name: qaorg, captioning, summary, story, nq, gsm8k
    prompt: str
    images: tuple[Image.Image, ...] = field(default=(), compare=False, repr=False)
    category: str = "benchmark"  # benchmark | ood | multi_image | text ...
    error: str | None = None
    # how decoding changed its images beyond the pixel format, e.g. "image 0: scaled-to-8-bit"
    # (pipeline.data.images); the pixels themselves are in `prompt_hash`
    image_conversions: tuple[str, ...] = ()
    answer: str | None = None  # a reference answer, where the dataset has one (user datasets)

    @property
    def sample_id(self) -> str:
        """Stable id used in result keys: dataset/split/row/turn."""
        return f"{self.dataset}/{self.split}/{self.row}/{self.turn}"

    @cached_property
    def prompt_hash(self) -> str:
        """Hash of everything the decoder is given: prompt text, image pixels, and the error
        when there is one. Result rows are keyed by it, so a row made from another prompt
        under the same id (a second turn built from another answer, an image restored since)
        is recognised as stale on resume."""
        digest = hashlib.sha256(self.prompt.encode())
        _add_pixels(digest, self.images)
        digest.update(f"|error:{self.error}".encode())
        return digest.hexdigest()[:16]

    @cached_property
    def image_hash(self) -> str:
        """Hash of the image pixels alone: samples that show the same pictures share it."""
        digest = hashlib.sha256()
        _add_pixels(digest, self.images)
        return digest.hexdigest()[:16]

    def check(self) -> None:
        """Raise ValueError naming the sample when its placeholders and images disagree."""
        n = self.prompt.count(IMAGE_PLACEHOLDER)
        if n != len(self.images):
            raise ValueError(
                f"sample {self.sample_id}: prompt has {n} {IMAGE_PLACEHOLDER} placeholder(s) "
                f"but {len(self.images)} image(s)"
            )


def _add_pixels(digest, images: tuple[Image.Image, ...]) -> None:
    for image in images:
        digest.update(f"|{image.mode}:{image.size}|".encode())
        digest.update(image.tobytes())
