"""Opening a scenario's rows (hub or local copy) and turning them into first-turn Samples.

Rows are streamed, so only the subset's rows are read, and images are decoded here rather
than by `datasets`: a missing or unreadable image then becomes that sample's `error` (the
caller records it and goes on) instead of an exception that ends the whole run. Samples keep
their images encoded (`EncodedImage`); the pixels are decoded again where a sample runs.

A local copy (`source`) is either a directory written by `datasets.save_to_disk` (a Dataset,
or a DatasetDict holding the registry's split or a single split of any name, as the authors'
download script writes them), or Parquet: one file, or a directory searched recursively (files
named after the split, e.g. `test-00000-of-00001.parquet`, are preferred when there are any).
"""
from __future__ import annotations

import dataclasses
import io
import logging
import os
from itertools import islice
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import datasets
import pyarrow.parquet as pq
from PIL import Image

from pipeline.data.images import MAX_IMAGE_PIXELS, EncodedImage, pixel_budget_problem, to_rgb
from pipeline.data.prompts import PromptError
from pipeline.data.registry import DatasetSpec, get_dataset
from pipeline.data.sample import FIRST_TURN, Sample
from pipeline.data.user_datasets import FILE_KINDS, image_reference

log = logging.getLogger(__name__)
# organisations whose datasets moved: lmms-eval moved lmms-lab's to lmms-lab-encoder in July 2026
MOVED_ORGS = {"lmms-lab/": "lmms-lab-encoder/"}


class DataSourceError(RuntimeError):
    """A dataset that cannot be opened: hub unreachable, local copy missing or malformed."""


def load_samples(
    dataset: str | DatasetSpec, *, limit: int | None = None, source: str | os.PathLike | None = None,
    max_image_pixels: int = MAX_IMAGE_PIXELS,
) -> list[Sample]:
    """First-turn Samples of a registered dataset (by name) or of `dataset`'s spec (a user's
    file): its first `limit` rows (default: the paper's subset).

    `source` is a local copy overriding the hub id (see module doc). Rows that cannot become a
    prompt (an image above `max_image_pixels` among them) come back with `error` set; a source
    that cannot be opened raises DataSourceError.
    """
    spec = dataset if isinstance(dataset, DatasetSpec) else get_dataset(dataset)
    name = spec.name
    count = spec.default_limit if limit is None else limit
    if count < 1:
        raise ValueError(f"dataset {name!r}: limit must be at least 1, got {count}")
    if spec.embedded:
        if source is not None:
            raise ValueError(f"dataset {name!r} ships with the project and takes no source (got {source!r})")
        rows: Iterator[Mapping[str, Any]] = iter(spec.embedded_rows())
    elif spec.path is not None:
        rows = open_rows(name, None, None, spec.split, spec.path, spec.required_columns)
    elif spec.local_file is not None:
        if source is None:
            raise DataSourceError(f"dataset {name!r} is on no hub this pipeline can load: pass its local "
                                  f"copy (the folder holding {spec.local_file} and images/) as source "
                                  f"(in a grid: sources: {{{spec.source_key}: /path/to/copy}})")
        spec = dataclasses.replace(spec, format_row=spec.format_row.within(source))
        rows = open_rows(name, None, None, spec.split, Path(source, spec.local_file), spec.required_columns)
    else:
        rows = open_rows(name, spec.hub_id, spec.config, spec.split, source, spec.required_columns)
    if spec.sub_task:
        rows = (row for row in rows if row.get(spec.sub_task_column) == spec.sub_task)
    return [row_to_sample(spec, index, row, max_image_pixels)
            for index, row in enumerate(islice(rows, count))]


def row_to_sample(spec: DatasetSpec, index: int, row: Mapping[str, Any],
                  max_image_pixels: int = MAX_IMAGE_PIXELS) -> Sample:
    """One row as a first-turn Sample; a bad row gives a Sample whose `error` says why."""
    sample = Sample(dataset=spec.name, split=spec.split, row=index, turn=FIRST_TURN, prompt="",
                    category=spec.category)
    try:
        source_id = row.get(spec.id_column) if spec.id_column else None
        if source_id is not None:
            sample = dataclasses.replace(sample, source_id=str(source_id))
        if spec.own_turns:  # kept when the image fails, so the follow-ups carry that error
            sample = dataclasses.replace(sample, followups=spec.format_row.questions(row)[1:])
        prompt, raw_images = spec.format_row(row)
        sample = dataclasses.replace(sample, prompt=prompt)
        loaded = [load_image(value, k, max_image_pixels) for k, value in enumerate(raw_images)]
        conversions = tuple(f"image {k}: {note}" for k, (_, notes) in enumerate(loaded) for note in notes)
        answer = row.get(spec.answer_column) if spec.answer_column else None
        sample = dataclasses.replace(sample, images=tuple(image for image, _ in loaded),
                                     image_conversions=conversions,
                                     answer=None if answer is None else str(answer))
        sample.check()
    except ValueError as exc:  # PromptError, or Sample.check's placeholder/image mismatch
        message = str(exc) if str(exc).startswith("sample ") else f"sample {sample.sample_id}: {exc}"
        return dataclasses.replace(sample, images=(), error=message)
    return sample


def load_image(value: Any, position: int,
               max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[EncodedImage, tuple[str, ...]]:
    """The image a row holds (PIL image, {'bytes', 'path'} struct, or a file path) as the sample
    keeps it, encoded, and the conversions `pipeline.data.images.to_rgb` applies to it. Its size
    is read from the header and checked against `max_pixels` before any pixel is decoded; it is
    then decoded once, so a broken file fails here as this sample's input error, and the
    pixels are dropped."""
    if value is None:
        raise PromptError(f"image {position} is missing")
    try:
        if isinstance(value, Image.Image):
            _check_pixels(value, position, max_pixels)
            image, notes = to_rgb(value)
            return EncodedImage.of(image), notes
        named = image_reference(value, f"image {position}")
        if isinstance(named, Path):
            named = named.read_bytes()
        if not isinstance(named, bytes):
            raise PromptError(f"image {position} is a {type(named).__name__}, not an image")
        with Image.open(io.BytesIO(named)) as opened:
            _check_pixels(opened, position, max_pixels)
            return EncodedImage(named), to_rgb(opened)[1]
    except Image.DecompressionBombError as exc:  # Pillow's own guard, at twice its MAX_IMAGE_PIXELS
        raise PromptError(f"image {position} is refused as a decompression bomb: {exc}") from exc
    except OSError as exc:  # PIL.UnidentifiedImageError, truncated data, missing file
        raise PromptError(f"image {position} cannot be read: {exc}") from exc


def _check_pixels(image: Image.Image, position: int, max_pixels: int) -> None:
    problem = pixel_budget_problem(image.size, max_pixels)
    if problem:
        raise PromptError(f"image {position} {problem}")


def open_rows(
    label: str,
    hub_id: str | None,
    config: str | None,
    split: str,
    source: str | os.PathLike | None,
    columns: Sequence[str],
) -> Iterator[Mapping[str, Any]]:
    """Rows of `hub_id` (config, split) from the hub, or of the local copy `source`, streamed,
    with image columns left undecoded. `label` names the dataset in errors."""
    dataset, where = open_dataset(label, hub_id, config, split, source, columns)
    return iter_rows(label, where, dataset)


def open_dataset(
    label: str,
    hub_id: str | None,
    config: str | None,
    split: str,
    source: str | os.PathLike | None,
    columns: Sequence[str],
) -> tuple[datasets.IterableDataset, str]:
    """The streamed dataset behind `open_rows` (image columns undecoded, `columns` checked)
    and a description of where it came from."""
    if source is not None:
        dataset = _open_local(label, Path(source), split)
        where = str(source)
    else:
        dataset, where = _open_hub(label, hub_id, config, split)
    dataset = _undecoded_images(dataset)
    present = dataset.column_names
    missing = [c for c in columns if present is not None and c not in present]
    if missing:
        raise DataSourceError(f"dataset {label!r}: {where} lacks column(s) {missing}; it has {present}")
    return dataset, where


def hub_names(hub_id: str) -> list[str]:
    """Where a hub dataset may be: its registered id, then the organisation lmms-eval moved it
    to (`lmms-lab/X` -> `lmms-lab-encoder/X`, July 2026)."""
    return [hub_id] + [new + hub_id[len(old):] for old, new in MOVED_ORGS.items() if hub_id.startswith(old)]


def _open_hub(label: str, hub_id: str | None, config: str | None,
              split: str) -> tuple[datasets.IterableDataset, str]:
    """The first of `hub_names` that opens, and where it was read; a warning says when that was
    the moved name. Every name that failed is named with its error."""
    failures = []
    for name in hub_names(hub_id):
        where = f"{name} ({config or 'default'} config, split {split}) on the hub"
        try:
            dataset = datasets.load_dataset(name, config, split=split, streaming=True)
        except Exception as exc:  # network, auth and missing-repo errors all end here
            failures.append(f"cannot open {where}: {exc}")
            continue
        if failures:
            log.warning("dataset %r: read %s (%s)", label, where, "; ".join(failures))
        return dataset, where
    raise DataSourceError(f"dataset {label!r}: {'; '.join(failures)}. Without hub access, pass a local "
                          "copy as source (a datasets.save_to_disk directory or Parquet files).")


def iter_rows(label: str, where: str, dataset: datasets.IterableDataset) -> Iterator[Mapping[str, Any]]:
    """Iterate, naming the dataset when the stream itself fails (streams open lazily)."""
    iterator = iter(dataset)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            return
        except Exception as exc:
            raise DataSourceError(f"dataset {label!r}: reading {where} failed: {exc}") from exc
        yield row


def _undecoded_images(dataset: datasets.IterableDataset) -> datasets.IterableDataset:
    for column, feature in (dataset.features or {}).items():
        if isinstance(feature, datasets.Image) and feature.decode:
            dataset = dataset.cast_column(column, datasets.Image(decode=False))
    return dataset


def _open_local(label: str, path: Path, split: str) -> datasets.IterableDataset:
    if not path.exists():
        raise DataSourceError(f"dataset {label!r}: local copy {path} does not exist")
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            loaded = _pick_split(label, loaded, split, path)
        return loaded.to_iterable_dataset()
    builder = FILE_KINDS.get(path.suffix.lower()) if path.is_file() else None
    if builder in ("json", "csv"):  # a user's JSONL or CSV file
        if path.stat().st_size == 0:
            raise DataSourceError(f"dataset {label!r}: {path} holds no rows")
        return datasets.load_dataset(builder, data_files=[str(path)], split="train", streaming=True)
    files = _parquet_files(path, split)
    if not files:
        raise DataSourceError(
            f"dataset {label!r}: {path} is neither a datasets.save_to_disk directory nor Parquet file(s)"
        )
    if sum(pq.read_metadata(f).num_rows for f in files) == 0:  # streaming it would fail obscurely
        raise DataSourceError(f"dataset {label!r}: local copy {path} holds no rows")
    return datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train", streaming=True)


def _pick_split(label: str, splits: datasets.DatasetDict, split: str, path: Path) -> datasets.Dataset:
    if split in splits:
        return splits[split]
    if len(splits) == 1:
        return next(iter(splits.values()))
    raise DataSourceError(f"dataset {label!r}: {path} has splits {list(splits)}, none named {split!r}")


def _parquet_files(path: Path, split: str) -> list[Path]:
    if path.is_file():
        return [path] if path.suffix == ".parquet" else []
    found = sorted(path.rglob("*.parquet"))
    named = [f for f in found if f.stem == split or f.stem.startswith(f"{split}-")]
    return named or found
