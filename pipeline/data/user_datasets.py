"""A researcher's own dataset, named in the grid file instead of registered in the library.

    datasets:
      - embedded_vqa
      - name: signs                 # the name rows and tables carry
        path: data/signs.jsonl      # JSONL, CSV, Parquet, or a datasets.save_to_disk directory
        question: prompt            # the question column (default: question)
        images: [photo]             # column(s) with an image, a path (relative to the file) or a list of them
        answer: label               # optional: kept in each row's `answer` column
        category: benchmark         # benchmark | ood (where the tables put it)
        allow_outside_paths: false  # image paths must stay inside the file's folder unless true

A question with `<image>` placeholders is used as written (one per image, in order); otherwise
the images come first, then the question, as for the built-in single-image datasets. Second
turns are built for these rows like for any dataset. Plain description here: no `datasets`,
no torch, so grid files validate without them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pipeline.data.prompts import PromptError, user_turn
from pipeline.data.sample import IMAGE_PLACEHOLDER
from pipeline.names import did_you_mean

FILE_KINDS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
CATEGORIES = ("benchmark", "ood")
OUTSIDE_HINT = " (allow_outside_paths: true on the dataset entry allows it)"
FIELDS = ("name", "path", "question", "images", "answer", "category", "split", "allow_outside_paths")


@dataclass(frozen=True)
class MappedColumns:
    """How one row of a user's file becomes a prompt and its images."""

    question: str = "question"
    images: tuple[str, ...] = ("image",)
    image_root: str = "."  # relative image paths are read from here (the data file's folder)
    allow_outside_paths: bool = False  # else a path that resolves outside image_root is refused

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.question, *self.images)

    def __call__(self, row: Mapping[str, Any]) -> tuple[str, list[Any]]:
        question = row.get(self.question)
        if not isinstance(question, str) or not question.strip():
            raise PromptError(f"column {self.question!r} holds no question text")
        images = [self._image(value, column) for column in self.images for value in _as_list(row.get(column))]
        if IMAGE_PLACEHOLDER in question:
            return user_turn(question), images
        return user_turn(f"{IMAGE_PLACEHOLDER}\n" * len(images) + question), images

    def _image(self, value: Any, column: str) -> Any:
        """Whatever form names the image, a path is checked by `confined_image`."""
        if value is None:
            raise PromptError(f"column {column!r} holds no image")
        return confined_image(value, self.image_root, column, self.allow_outside_paths, OUTSIDE_HINT)


def image_reference(value: Any, where: str) -> Any:
    """What an image cell names, in one form per kind: bytes (a datasets Image struct's), a Path (a
    string, a pathlib.Path, or the struct's `path` when it has no bytes), or `value` as given
    (a PIL image; the loader refuses anything else). PromptError starting with `where` for a
    struct whose bytes are not bytes, or that has neither bytes nor a path."""
    if isinstance(value, Mapping):
        data = value.get("bytes")
        if data is not None and not isinstance(data, (bytes, bytearray)):
            raise PromptError(f"{where}: the image's bytes are a {type(data).__name__}, not bytes")
        if data:
            return bytes(data)  # a path beside them is only a name, never opened
        value = value.get("path")
        if not value:
            raise PromptError(f"{where}: the image has neither bytes nor a path")
    return Path(value) if isinstance(value, (str, os.PathLike)) else value


def confined_image(value: Any, image_root: str | Path, column: str, allow_outside: bool = False,
                   hint: str = "") -> Any:
    """The image `value` names (any form of `image_reference`); a path is resolved against
    `image_root` and must stay inside that folder (checked before anything is opened: a shared
    file must not read the rest of the disk) and exist; PromptError naming `column` otherwise
    (`hint`: how to allow it)."""
    named = image_reference(value, f"column {column!r}")
    if not isinstance(named, Path):
        return named
    path = named.expanduser()
    path = path if path.is_absolute() else Path(image_root) / path
    root = Path(image_root).resolve()
    if not allow_outside and not path.resolve().is_relative_to(root):
        raise PromptError(f"column {column!r}: image path {str(named)!r} leaves the dataset folder "
                          f"{root}{hint}")
    if not path.is_file():
        raise PromptError(f"column {column!r}: image file {str(named)!r} does not exist "
                          f"(looked in {path.parent})")
    return path


def local_path(path: str, base: str | Path) -> Path:
    """`path` as this machine finds it: `~` expanded, a relative path read from `base` (the
    grid file's folder); FileNotFoundError saying where it looked."""
    given = Path(path).expanduser()
    found = given if given.is_absolute() else Path(base) / given
    if not found.exists():
        relative = "" if given.is_absolute() else f", relative to the grid file's folder {base}"
        raise FileNotFoundError(f"looked for {found}{relative}")
    return found


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


@dataclass(frozen=True)
class UserDataset:
    """One `datasets:` entry that names a file: validated when the grid is read."""

    name: str
    path: str
    question: str = "question"
    images: tuple[str, ...] = ("image",)
    answer: str | None = None
    category: str = "benchmark"
    split: str = "test"
    allow_outside_paths: bool = False

    @property
    def columns(self) -> MappedColumns:
        data = Path(self.path).expanduser().resolve()
        return MappedColumns(self.question, self.images, str(data if data.is_dir() else data.parent),
                             self.allow_outside_paths)

    @property
    def required_columns(self) -> tuple[str, ...]:
        return self.columns.columns + ((self.answer,) if self.answer else ())


def parse_user_dataset(entry: Mapping[str, Any], where: str, taken: set[str],
                       base: str | Path = ".") -> UserDataset:
    """A `datasets:` mapping as a UserDataset; ValueError naming `where` and the problem. A
    relative `path` is read from `base` (the grid file's folder) and kept absolute."""
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}{did_you_mean(unknown[0], FIELDS)}; "
                         f"a dataset entry has {list(FIELDS)}")
    name, path = entry.get("name"), entry.get("path")
    if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"{where}: `name` must be a word (letters, digits, _ or -), got {name!r}")
    if name in taken:
        raise ValueError(f"{where}: dataset name {name!r} is already taken (built-in or listed before)")
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where} ({name}): `path` must name a file or directory")
    try:
        found = local_path(path, base)
    except FileNotFoundError as err:
        raise ValueError(f"{where} ({name}): {path} does not exist ({err})") from None
    if found.is_file() and found.suffix.lower() not in FILE_KINDS:
        raise ValueError(f"{where} ({name}): {path} is not JSONL, CSV or Parquet "
                         f"(known: {', '.join(FILE_KINDS)})")
    images = entry.get("images", ["image"])
    images = [images] if isinstance(images, str) else images
    text_fields = {"question": entry.get("question", "question"), "answer": entry.get("answer"),
                   "split": entry.get("split", "test")}
    for field_name, value in text_fields.items():
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{where} ({name}): `{field_name}` must be a column name, got {value!r}")
    if not isinstance(images, list) or not all(isinstance(c, str) for c in images):
        raise ValueError(f"{where} ({name}): `images` must be a list of column names, got {images!r}")
    category = entry.get("category", "benchmark")
    if category not in CATEGORIES:
        raise ValueError(f"{where} ({name}): category must be one of {CATEGORIES}, got {category!r}"
                         f"{did_you_mean(category, CATEGORIES)}")
    outside = entry.get("allow_outside_paths", False)
    if not isinstance(outside, bool):
        raise ValueError(f"{where} ({name}): `allow_outside_paths` must be true or false, got {outside!r}")
    return UserDataset(name, str(found.resolve()), text_fields["question"], tuple(images),
                       text_fields["answer"], category, text_fields["split"], outside)
