"""Offline first-turn scenarios on the easy-VQA test images (64x64 shapes, shipped by `easy-vqa`).

The prompts are open-ended on purpose: speculative decoding is only measurable on long
answers (64-128 tokens), so every scenario asks for a description, a comparison or a story.
The test split is used so that a model trained on easy-VQA's train split sees unseen images.
Rows are plain dicts that `pipeline.data.registry` formats; image values are file paths.
"""
from __future__ import annotations

import functools
import re
from typing import Iterator

import easy_vqa

from pipeline.data.sample import IMAGE_PLACEHOLDER as IMG

COLORS = frozenset({"red", "green", "blue", "yellow", "teal", "brown", "black", "gray"})
SHAPES = frozenset({"circle", "rectangle", "triangle"})

DESCRIBE_PROMPTS = (
    f"{IMG}\nDescribe the image in detail.",
    f"{IMG}\nWhat do you see in this picture? Explain.",
    f"{IMG}\nWrite a short story about this picture.",
    f"{IMG}\nDescribe the shape in this image, its color and where it is placed.",
)

# Wordings modelled on the paper's multi-image benchmarks (Spot-the-Diff, IEdit, Appendix I).
COMPARE_PROMPTS = (
    f"Compare the two images and describe how they differ. First image: {IMG} Second image: {IMG}",
    f"Explain the disparities between the first and second image. {IMG} {IMG} Difference:",
    f"{IMG}\n{IMG}\nWhat changed from the first picture to the second? Describe both pictures in detail.",
    "Please provide instructions for editing the source image to match the target image. "
    f"Source Image: {IMG} Target Image: {IMG} Instruction:",
)

# Five-image stories in the PororoSV / VIST format (Appendix I): four captioned images and a
# fifth to end the story on; out of distribution for a model trained on single images.
STORY_INSTRUCTIONS = (
    "Given the progression of the story with the first few images, "
    "can you write a fitting end considering the last image?",
    "With the narratives paired with the initial images, "
    "how would you conclude the story using the last picture?",
)
STORY_CAPTIONS = (
    "First, a {color} {shape} appears.",
    "Then a {color} {shape} comes along.",
    "Next, a {color} {shape} joins them.",
    "After that, a {color} {shape} shows up.",
)
STORY_LENGTH = len(STORY_CAPTIONS) + 1
# A long prompt: twenty images (about 1000 prompt tokens on the embedded pair, 49 per image),
# where a state-space draft's step, flat in the context, should gain on an attention draft's.
GALLERY_LENGTH = 20
GALLERY_PROMPTS = (
    "Here is a gallery of shapes: {images} Describe the gallery: "
    "which colors and shapes appear, and how often?",
    "{images} These are pictures from one collection. Which picture stands out, and why? "
    "Describe it in detail.",
)


# Answers that repeat the prompt (reading out or editing a given text): where a draft-free lookup
# over the prompt (prompt lookup decoding) proposes whole runs of the answer with no model.
QUOTE_TEXT = ("The picture shows a {color} {shape} on a white background. The {color} {shape} is the "
              "only shape in the picture, and nothing else is drawn around it.")
QUOTE_PROMPTS = (
    f"{IMG}\nCopy this caption exactly, word for word: \"{{text}}\"",
    f"{IMG}\nHere is a caption for the picture: \"{{text}}\" Repeat the caption, then say if it is right.",
    f"{IMG}\nRewrite this paragraph, keeping every sentence as it is: \"{{text}}\"",
)


@functools.cache
def image_paths() -> dict[int, str]:
    """Paths of the easy-VQA test images by image id, in id order (do not mutate: cached)."""
    return dict(sorted(easy_vqa.get_test_image_paths().items()))


@functools.cache
def _questions() -> tuple[tuple[str, str, int], ...]:
    return tuple(zip(*easy_vqa.get_test_questions()))


@functools.cache
def shape_facts() -> dict[int, tuple[str, str]]:
    """(color, shape) of each test image whose questions state both.

    Each image holds one shape, so every color or shape word that a question asserts about
    the image describes it: a "what ..." question and its answer always do; a yes/no question
    does when it is answered "yes" without negation, or "no" with it.
    """
    words: dict[int, set[str]] = {}
    for question, answer, image_id in _questions():
        tokens = set(re.findall(r"[a-z]+", question))
        if answer in ("yes", "no"):
            negated = bool(tokens & {"not", "no"})
            asserted = tokens if (answer == "yes") != negated else set()
        else:
            asserted = tokens | {answer}
        words.setdefault(image_id, set()).update(asserted & (COLORS | SHAPES))
    facts = {}
    for image_id, found in words.items():
        colors, shapes = found & COLORS, found & SHAPES
        if len(colors) == 1 and len(shapes) == 1:
            facts[image_id] = (next(iter(colors)), next(iter(shapes)))
    return facts


def vqa_rows() -> Iterator[dict]:
    """One easy-VQA question per test image (its first), in image order."""
    paths = image_paths()
    seen: set[int] = set()
    for question, _answer, image_id in _questions():
        if image_id not in seen:
            seen.add(image_id)
            yield {"question": question, "image": paths[image_id]}


def describe_rows() -> Iterator[dict]:
    """Each test image with an open request, cycling through DESCRIBE_PROMPTS."""
    for i, path in enumerate(image_paths().values()):
        yield {"text": DESCRIBE_PROMPTS[i % len(DESCRIBE_PROMPTS)], "images": [path]}


def compare_rows() -> Iterator[dict]:
    """Consecutive pairs of test images (0-1, 2-3, ...) with a comparison request."""
    paths = list(image_paths().values())
    for i in range(len(paths) // 2):
        yield {"text": COMPARE_PROMPTS[i % len(COMPARE_PROMPTS)], "images": paths[2 * i:2 * i + 2]}


def story_rows() -> Iterator[dict]:
    """Consecutive groups of five described test images as a story to finish."""
    paths, facts = image_paths(), shape_facts()
    described = [image_id for image_id in paths if image_id in facts]
    for i in range(len(described) // STORY_LENGTH):
        group = described[i * STORY_LENGTH:(i + 1) * STORY_LENGTH]
        parts = [STORY_INSTRUCTIONS[i % len(STORY_INSTRUCTIONS)]]
        for k, image_id in enumerate(group[:-1]):
            color, shape = facts[image_id]
            caption = STORY_CAPTIONS[k].format(color=color, shape=shape)
            parts.append(f"{IMG} Caption #{k + 1}: {caption}")
        parts.append(f"{IMG} Caption #{STORY_LENGTH}:")
        yield {"text": " ".join(parts), "images": [paths[image_id] for image_id in group]}


def gallery_rows() -> Iterator[dict]:
    """Consecutive groups of twenty test images with a request about the whole gallery; a
    second pass over the images, shifted by half a gallery, doubles the rows."""
    paths = list(image_paths().values())
    per_pass = len(paths) // GALLERY_LENGTH
    for i in range(2 * per_pass):
        first = i * GALLERY_LENGTH + (i // per_pass) * (GALLERY_LENGTH // 2)
        group = [paths[(first + k) % len(paths)] for k in range(GALLERY_LENGTH)]
        text = GALLERY_PROMPTS[i % len(GALLERY_PROMPTS)].format(images=" ".join([IMG] * GALLERY_LENGTH))
        yield {"text": text, "images": group}


def quote_rows() -> Iterator[dict]:
    """Each described test image with a caption of it to read out or rewrite (`QUOTE_PROMPTS`)."""
    paths, facts = image_paths(), shape_facts()
    for i, image_id in enumerate(image_id for image_id in paths if image_id in facts):
        color, shape = facts[image_id]
        text = QUOTE_TEXT.format(color=color, shape=shape)
        yield {"text": QUOTE_PROMPTS[i % len(QUOTE_PROMPTS)].format(text=text), "images": [paths[image_id]]}
