"""Scenarios: the paper's datasets and the embedded offline set, as immutable Samples.

API used by grid planning and the run's samples (`pipeline.planning`):

- ``DATASETS: dict[str, DatasetSpec]`` and ``get_dataset(name)`` (unknown name: ValueError
  listing the known ones). Names: llava_bench, docvqa, pope, mmvet, iedit, magicbrush,
  spot_the_diff, pororo_sv, vist (public sources) and embedded_vqa, embedded_describe,
  embedded_compare, embedded_story, embedded_gallery (offline, on easy-VQA images), and mmspec
  with one per topic, mmspec_general_vqa ... mmspec_complex_reasoning (a local copy only).
- ``load_samples(name_or_spec, *, limit=None, source=None) -> list[Sample]``: first turn, the first
  ``limit`` rows (default 100, 60 for LLaVA-Bench); a ``DatasetSpec`` of a user's own file
  (``pipeline.data.user_datasets``) works like a name. ``source`` is a local copy (a
  ``datasets.save_to_disk`` directory or Parquet files) used instead of the hub; an unreachable
  or malformed source raises ``DataSourceError`` naming the dataset.
- ``build_second_turn(first_samples, first_outputs, task, *, source=None) -> list[Sample]`` with
  ``task`` in ``TURN_TASKS``; ``first_outputs`` maps first-turn sample ids to the target's
  answers; ``source`` is a local copy of the NQ-open / GSM8K questions.
- ``build_followup(previous_samples, previous_outputs, turn)`` with ``turn`` in
  ``FOLLOWUP_TURNS`` (followup, followup2, followup3): a dataset's own next questions (MMSpec's
  ``turns``), each after the target's answer to the turn before; rows without one are left out.
- ``python -m pipeline.data.fetch OUT_DIR [NAME ...]`` (where the hub is reachable) writes
  those local copies, one ``save_to_disk`` directory per dataset holding only the subset.

A row that cannot become a prompt (missing or unreadable image, placeholder/image count
mismatch, missing first-turn answer) yields a Sample with ``error`` set instead of raising.
Prompts follow ``USER: ... ASSISTANT:``; see ``pipeline.data.prompts`` for the exact format.
"""
from __future__ import annotations

import importlib

# Attributes load on first use: the decoding core imports `pipeline.data.sample` and must not
# pull in `datasets` (absent on a bare GPU box) through this package's __init__.
_EXPORTS = {
    "DataSourceError": "pipeline.data.loading",
    "load_samples": "pipeline.data.loading",
    "DATASETS": "pipeline.data.registry",
    "DatasetSpec": "pipeline.data.registry",
    "get_dataset": "pipeline.data.registry",
    "Sample": "pipeline.data.sample",
    "TURN_TASKS": "pipeline.data.turns",
    "build_second_turn": "pipeline.data.turns",
    "build_followup": "pipeline.data.turns",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipeline.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
