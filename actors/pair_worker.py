"""The Ray actor that owns one target+draft pair and turns shards into result rows.

`PairEvaluator` is a plain class (testable without Ray); `remote_worker` wraps it as an actor
that Ray restarts when it dies (reloading the pair) and whose interrupted calls Ray retries,
so a lost worker costs time but never rows.
"""
from __future__ import annotations

import os
import re
from collections import defaultdict
from typing import Sequence

import pyarrow as pa
import torch
from PIL import Image

from actors.model_files import resolve_model
from pipeline.data.sample import Sample
from pipeline.decoding.live import autoregressive_decode, speculative_decode
from pipeline.decoding.records import SampleRecord
from pipeline.drafting.captioner import load_captioner
from pipeline.drafting.methods import METHODS
from pipeline.planning.grid import Pair, RunConfig, Shard
from pipeline.planning.plugins import load_drafting_methods
from pipeline.models.loading import default_device, load_pair
from pipeline.results.schema import make_row
from pipeline.results.store import rows_to_table

# A bad input: a clear input error (ModelInputError is a ValueError), an unreadable or
# oversized image.
INPUT_ERRORS = (ValueError, OSError, Image.DecompressionBombError)
Items = Sequence[tuple[RunConfig, str]]  # (configuration, sample id)


def quiet_libraries() -> None:
    """No progress bars from transformers (weights, GGUF tensors) or the hub in a worker: its
    output is the run's log, one line per shard."""
    from transformers.utils import logging as transformers_logging

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    transformers_logging.disable_progress_bar()


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


class PairEvaluator:
    """Loads one pair (and the captioner, if any method set needs it) once per process, after
    importing the grid's own drafting methods (`drafting_methods`: import paths); `allow_text`:
    the grid marked the pair `text_only`."""

    def __init__(
        self, pair: Pair, captioner: str | None = None, drafting_methods: tuple[str, ...] = (), allow_text: bool = False
    ) -> None:
        load_drafting_methods(list(drafting_methods))
        quiet_libraries()
        self.pair = pair
        self.device = default_device()
        self.target, self.draft = load_pair(
            resolve_model(pair.target), resolve_model(pair.draft), dtype=pair.dtype, device=self.device,
            allow_text=allow_text,
        )
        self.captioner = load_captioner(captioner, self.device) if captioner else None

    def device_name(self) -> str:
        return str(self.device)

    def run_shard(self, shard: Shard, samples: dict[str, Sample]) -> pa.Table:
        """Rows for every item of the shard, in item order; one bad sample is one error row."""
        if shard.pair != self.pair:
            raise ValueError(f"shard {shard.shard_id} is for {shard.pair.label}, this worker holds {self.pair.label}")
        records = self._replay(shard.items, samples) if shard.mode == "replay" else {}
        for config, sample_id in shard.items:
            if (config, sample_id) not in records:
                records[(config, sample_id)] = self.decode(config, samples[sample_id])
        if shard.mode == "live":
            self._shadow_replay(shard.items, samples, records)
        return rows_to_table([
            make_row(shard.run, shard.shard_id, config, samples[sample_id], records[(config, sample_id)], sample_id in shard.timed)
            for config, sample_id in shard.items
        ])

    def decode(self, config: RunConfig, sample: Sample) -> SampleRecord:
        """One live decode (SD or the AR baseline) on the configuration's engine."""
        mode = "ar" if config.is_ar else "live"
        try:
            if config.is_ar:
                return autoregressive_decode(
                    self.target, sample, max_new_tokens=config.max_new_tokens,
                    temperature=config.temperature, seed=config.seed, engine=config.decode_engine,
                )
            return speculative_decode(
                self.target, self.draft, sample, config.decode_config(), self.captioner, engine=config.decode_engine
            )
        except Exception as err:  # one sample under one configuration; the shard goes on
            return failed(sample.sample_id, mode, err)

    def _shadow_replay(self, items: Items, samples: dict[str, Sample], records: dict[tuple[RunConfig, str], SampleRecord]) -> None:
        """Score the live greedy SD rows by trace replay too and keep replay's accepted counts
        beside live's (`replay_accepted_per_block`): the report's check that replay-scored rows
        are what live decoding gives. A replay that fails leaves the live row as it is."""
        checked = [(c, s) for c, s in items if c.greedy and not c.is_ar and records[(c, s)].error is None]
        for item, shadow in self._replay(checked, samples).items():
            if shadow.error is None:
                records[item].replay_accepted_per_block = shadow.accepted_per_block

    def _replay(self, items: Items, samples: dict[str, Sample]) -> dict[tuple[RunConfig, str], SampleRecord]:
        """Greedy SD items scored from one trace collection per sample and engine setting
        (pipeline.decoding.replay): the AR baseline row is the collection's own decode, so its
        walltime belongs to the engine that collected."""
        from pipeline.decoding.replay import collect_traces, replay

        groups: dict[tuple[str, str], list[RunConfig]] = defaultdict(list)
        for config, sample_id in items:
            groups[(sample_id, config.engine)].append(config)
        records = {}
        for (sample_id, _), configs in groups.items():
            letters = "".join(m for m in METHODS if any(m in c.methods for c in configs if not c.is_ar))
            if not letters:  # only AR baselines here: decoded live by run_shard
                continue
            try:
                traces = collect_traces(
                    self.target, self.draft, samples[sample_id], letters, self.captioner,
                    max_new_tokens=max(c.max_new_tokens for c in configs), engine=configs[0].decode_engine,
                )
            except Exception as err:  # this sample's rows fail; the shard goes on
                records.update({(c, sample_id): failed(sample_id, "ar" if c.is_ar else "replay", err) for c in configs})
                continue
            for config in configs:
                if config.is_ar:  # the decode that produced y is the baseline row, when budgets match
                    if config.max_new_tokens == traces.max_new_tokens:
                        records[(config, sample_id)] = traces.baseline
                    continue
                try:
                    records[(config, sample_id)] = replay(traces, config.decode_config())
                except Exception as err:  # one configuration of this sample
                    records[(config, sample_id)] = failed(sample_id, "replay", err)
        return records


def remote_worker(
    pair: Pair, captioner: str | None, *, num_gpus: float, num_cpus: float, max_restarts: int = 2,
    drafting_methods: tuple[str, ...] = (), allow_text: bool = False,
):
    """Start a `PairEvaluator` actor. Ray restarts it up to `max_restarts` times and retries
    calls that were in flight when it died; the runner (`actors.runner`) re-dispatches beyond that."""
    import ray

    actor = ray.remote(PairEvaluator).options(
        num_gpus=num_gpus, num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=max_restarts
    )
    return actor.remote(pair, captioner, drafting_methods, allow_text)
