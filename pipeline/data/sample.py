"""The immutable unit of work: one prompt (with its images) of one dataset row and turn."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable

from PIL import Image

from pipeline.data.images import EncodedImage

IMAGE_PLACEHOLDER = "<image>"
FIRST_TURN = "first"  # a Sample's turn when it opens the conversation
# The dataset's own 2nd, 3rd and 4th questions (MMSpec's `turns`); each continues the turn before it.
FOLLOWUP_TURNS = ("followup", "followup2", "followup3")


def turn_index(turn: str) -> int:
    """Which question of the conversation `turn` asks (0: the first); a turn is run after the
    turns of lower index, since its prompt holds their answers."""
    if turn == FIRST_TURN:
        return 0
    return FOLLOWUP_TURNS.index(turn) + 1 if turn in FOLLOWUP_TURNS else 1


def previous_turn(turn: str) -> str:
    """The turn whose prompt and answer `turn` continues."""
    index = turn_index(turn)
    return FIRST_TURN if index <= 1 else FOLLOWUP_TURNS[index - 2]


@dataclass(frozen=True)
class Sample:
    """One prompt as the target sees it.

    `prompt` is the whole conversation text WITHOUT the BOS token (the tokenizer adds it),
    e.g. ``"USER: <image>\\nWhat is shown? ASSISTANT:"``; each `<image>` stands for one entry
    of `images`, in order; they are held encoded and decoded by `pixels` where the sample is
    run, so a driver holding a run's samples holds no pixels. `error` is set (and `images` may
    be empty) when the row could not be turned into a prompt: the caller records the sample as
    failed and goes on.
    """

    dataset: str
    split: str
    row: int
    turn: str  # "first", a second-turn task (qaorg, captioning, summary, story, nq, gsm8k) or FOLLOWUP_TURNS
    prompt: str
    images: tuple[EncodedImage, ...] = field(default=(), compare=False, repr=False)
    category: str = "benchmark"  # benchmark | ood | multi_image | text ...
    error: str | None = None
    # how decoding changed its images beyond the pixel format, e.g. "image 0: scaled-to-8-bit"
    # (pipeline.data.images); the pixels themselves are in `prompt_hash`
    image_conversions: tuple[str, ...] = ()
    answer: str | None = None  # a reference answer, where the dataset has one (user datasets)
    source_id: str | None = None  # the row's id in its dataset (MMSpec's `id`), where it has one
    # the dataset's own later questions of this conversation (FOLLOWUP_TURNS), where it has them
    followups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """An in-memory picture given as an image (a test's, a plug-in's) is held encoded too."""
        if any(isinstance(image, Image.Image) for image in self.images):
            held = tuple(EncodedImage.of(i) if isinstance(i, Image.Image) else i for i in self.images)
            object.__setattr__(self, "images", held)

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

    def pixels(self) -> tuple[Image.Image, ...]:
        """The images decoded as the models take them (8-bit RGB, pipeline.data.images.to_rgb)."""
        return tuple(image.pixels() for image in self.images)

    def has_turn(self, turn: str) -> bool:
        """Whether this row's conversation reaches `turn`: a follow-up turn needs that many
        questions of the dataset's own; every other turn is built for every row."""
        return turn not in FOLLOWUP_TURNS or len(self.followups) >= turn_index(turn)

    def check(self) -> None:
        """Raise ValueError naming the sample when its placeholders and images disagree."""
        n = self.prompt.count(IMAGE_PLACEHOLDER)
        if n != len(self.images):
            raise ValueError(
                f"sample {self.sample_id}: prompt has {n} {IMAGE_PLACEHOLDER} placeholder(s) "
                f"but {len(self.images)} image(s)"
            )


def turn_count(first_samples: Iterable[Sample], turn: str) -> int:
    """How many samples `turn` has, given its dataset's first-turn samples."""
    return sum(sample.has_turn(turn) for sample in first_samples)


def _add_pixels(digest, images: tuple[EncodedImage, ...]) -> None:
    """Hash each image's decoded pixels (as before images were held encoded, so keys of earlier
    runs still match), one image decoded at a time."""
    for encoded in images:
        image = encoded.pixels()
        digest.update(f"|{image.mode}:{image.size}|".encode())
        digest.update(image.tobytes())
