"""A sample that fails is a row, not a lost shard: its error text and why it failed (input,
model, resource), and notes a row carries when its decode left the requested path."""
from __future__ import annotations

import re
from dataclasses import replace

import torch
from PIL import Image

from pipeline.decoding.records import SampleRecord

# A bad input: a clear input error (ModelInputError is a ValueError), an unreadable or
# oversized image.
INPUT_ERRORS = (ValueError, OSError, Image.DecompressionBombError)


def error_category(err: Exception) -> str:
    """input | resource | model (pipeline.decoding.records.ERROR_CATEGORIES)."""
    if isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower():
        return "resource"
    return "input" if isinstance(err, INPUT_ERRORS) else "model"


def failed(sample_id: str, mode: str, err: Exception) -> SampleRecord:
    """The error row of one sample under one configuration; the text carries no object
    addresses, so reruns write the same text."""
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", f"{type(err).__name__}: {err}")
    return SampleRecord(sample_id=sample_id, mode=mode, error=text, error_category=error_category(err))


def noted(record: SampleRecord, note: str | None) -> SampleRecord:
    """`record` with `note` added to its fallback (a copy: baseline records serve several rows)."""
    if not note:
        return record
    return replace(record, fallback="; ".join(filter(None, (record.fallback, note))))
