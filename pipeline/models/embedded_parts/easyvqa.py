"""easy-vqa images with their colour and shape, read off the package's questions and answers.

easy-vqa ships 64x64 pictures of one coloured shape and yes/no or one-word questions about
them, but no per-image labels; every "what colour / what shape" answer and every mentioned
attribute of a yes/no question says what the picture has or lacks. That labels almost every
image; the few whose questions leave the colour or shape open are left out (a contradiction
raises, naming the image).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

COLORS = ("red", "green", "blue", "yellow", "teal", "brown", "gray", "black")
SHAPES = ("circle", "rectangle", "triangle")
SPLITS = ("train", "test")
_NEGATION = re.compile(r"\b(not|no)\b")


@dataclass(frozen=True)
class LabelledImage:
    image_id: int
    path: Path
    color: str
    shape: str
    questions: tuple[str, ...] = field(default=(), repr=False)

    @property
    def caption(self) -> str:
        """The short caption the captioner writes and the projector is taught: "a blue circle"."""
        return f"a {self.color} {self.shape}"


def _mentioned(words: set[str], vocabulary: tuple[str, ...]) -> str | None:
    found = [w for w in vocabulary if w in words]
    return found[0] if len(found) == 1 else None


def _facts(question: str, answer: str) -> list[tuple[str, str]]:
    """(kind, value) facts a question and its answer state about the image."""
    words = set(re.findall(r"[a-z]+", question.lower()))
    facts: list[tuple[str, str]] = []
    if answer in COLORS:
        facts.append(("color", answer))
    elif answer in SHAPES:
        facts.append(("shape", answer))
    if answer in COLORS or answer in SHAPES:  # "what is the blue shape?", "what color is the circle?"
        color, shape = _mentioned(words, COLORS), _mentioned(words, SHAPES)
        facts += [("color", color)] if color else []
        facts += [("shape", shape)] if shape else []
    elif answer in ("yes", "no"):
        present = (answer == "yes") != bool(_NEGATION.search(question.lower()))
        for kind, vocabulary in (("color", COLORS), ("shape", SHAPES)):
            value = _mentioned(words, vocabulary)
            if value:
                facts.append((kind, value) if present else (f"not {kind}", value))
    return facts


def load_split(split: str) -> list[LabelledImage]:
    """Every image of an easy-vqa split with its colour and shape, sorted by image id."""
    import easy_vqa

    if split not in SPLITS:
        raise ValueError(f"unknown easy-vqa split {split!r}; choose one of {SPLITS}")
    questions, answers, image_ids = getattr(easy_vqa, f"get_{split}_questions")()
    paths = getattr(easy_vqa, f"get_{split}_image_paths")()
    facts: dict[int, set[tuple[str, str]]] = {i: set() for i in paths}
    asked: dict[int, list[str]] = {i: [] for i in paths}
    for question, answer, image_id in zip(questions, answers, image_ids):
        facts[image_id].update(_facts(question, answer))
        asked[image_id].append(question)
    out = []
    for image_id in sorted(paths):
        color = _resolve(facts[image_id], "color", COLORS, split, image_id)
        shape = _resolve(facts[image_id], "shape", SHAPES, split, image_id)
        if color and shape:
            out.append(LabelledImage(image_id, Path(paths[image_id]), color, shape, tuple(asked[image_id])))
    return out


def _resolve(facts: set[tuple[str, str]], kind: str, vocabulary: tuple[str, ...], split: str,
             image_id: int) -> str | None:
    """The one value the facts allow (stated, or the last one not ruled out); None if open."""
    stated = {value for k, value in facts if k == kind}
    left = stated or set(vocabulary) - {value for k, value in facts if k == f"not {kind}"}
    if len(stated) > 1 or not left:
        raise ValueError(f"easy-vqa {split} image {image_id}: "
                         f"its questions contradict each other on its {kind}")
    return left.pop() if len(left) == 1 else None
