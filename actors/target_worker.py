"""The Ray actor that owns one target and its drafts and turns shards into result rows.

`TargetWorker` is a plain class (testable without Ray); `remote_worker` wraps it as an actor
that Ray restarts when it dies (reloading its models) and whose interrupted calls Ray retries,
so a lost worker costs time but never rows.
"""
from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from dataclasses import replace
from typing import Callable, Sequence, TypeVar

import pyarrow as pa
import torch
from PIL import Image

from actors.model_files import resolve_model
from pipeline.data.sample import Sample
from pipeline.decoding.engine import default_engine
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.decoding.records import SampleRecord
from pipeline.drafting.captioner import load_captioner
from pipeline.drafting.methods import METHODS
from pipeline.planning.grid import ModelGroup, RunConfig, Shard
from pipeline.planning.plugins import load_drafting_methods
from pipeline.models.base import LVLM
from pipeline.models.devices import cpu_cores, device_name, library_versions, machine_load
from pipeline.models.hf import one_line
from pipeline.models.loading import default_device, load_target_and_drafts
from pipeline.results.schema import make_row
from pipeline.results.store import rows_to_table

# A bad input: a clear input error (ModelInputError is a ValueError), an unreadable or
# oversized image.
INPUT_ERRORS = (ValueError, OSError, Image.DecompressionBombError)
Items = Sequence[tuple[RunConfig, str]]  # (configuration, sample id)
# A timed sample's live decodes (AR and SD alike) run this often and the fastest is kept: on a
# shared machine noise only ever adds time, and one slow moment moved a whole speedup by 20%.
TIMED_REPEATS = 2
T = TypeVar("T")
log = logging.getLogger(__name__)


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


class TargetWorker:
    """Loads one model group — a target and every draft the grid pairs with it — once per
    process (and the captioner, if any method set needs it), after importing the grid's own
    drafting methods (`drafting_methods`: import paths); `allow_text`: the grid marked the
    group's pairs `text_only`. Drafts share the target's decodes: per sample and engine, one
    greedy decode of the target and one teacher-forced target pass serve every draft.
    `threads`: CPU threads torch computes with (None: torch's default)."""

    def __init__(
        self, group: ModelGroup, captioner: str | None = None, drafting_methods: tuple[str, ...] = (),
        allow_text: bool = False, threads: int | None = None,
    ) -> None:
        if threads:
            torch.set_num_threads(threads)
        load_drafting_methods(list(drafting_methods))
        quiet_libraries()
        self.group = group
        self.device = default_device()
        self.target, self.drafts = load_target_and_drafts(
            resolve_model(group.target), {d: resolve_model(d) for d in group.drafts}, dtype=group.dtype,
            device=self.device, allow_text=allow_text,
        )
        self.captioner = load_captioner(captioner, self.device) if captioner else None
        # why the static engine failed here, once it has: `engine: auto` then decodes on eager
        self._static_failure: str | None = None

    def device_name(self) -> str:
        """Where it decodes: the device, and on a CPU the threads (e.g. `cpu (threads: 2)`)."""
        return str(self.device) if self.device.type != "cpu" else f"cpu (threads: {torch.get_num_threads()})"

    def environment(self) -> dict[str, str | int]:
        """What every row of this worker was timed on: the device by name, torch, transformers
        and the machine's cores (what its load average is read against)."""
        return {"device_name": device_name(self.device), **library_versions(), "cpu_cores": cpu_cores()}

    def run_shard(self, shard: Shard, samples: dict[str, Sample]) -> pa.Table:
        """Rows for every item of the shard, in item order; one bad sample is one error row."""
        if shard.group != self.group:
            raise ValueError(f"shard {shard.shard_id} is for {shard.group.label}, this worker holds {self.group.label}")
        records = self._replay(shard.items, samples) if shard.mode == "replay" else {}
        baselines: dict[tuple, SampleRecord] = {}  # AR is the target alone: one decode serves every draft's row
        for config, sample_id in sorted(shard.items, key=lambda item: not item[0].decode.is_ar):
            if (config, sample_id) in records:
                continue
            repeats = TIMED_REPEATS if sample_id in shard.timed else 1
            if config.decode.is_ar:
                key = (sample_id, self._engine(config), config.decode.max_new_tokens, config.decode.temperature, config.decode.seed)
                if key not in baselines:
                    baselines[key] = self.decode(config, samples[sample_id], repeats)
                records[(config, sample_id)] = baselines[key]
            else:
                records[(config, sample_id)] = self.decode(config, samples[sample_id], repeats)
        if shard.mode == "live":
            self._shadow_replay(shard.items, samples, records)
        environment = self.environment()
        return rows_to_table([
            make_row(shard.run, shard.shard_id, config, samples[sample_id], records[(config, sample_id)],
                     sample_id in shard.timed, environment)
            for config, sample_id in shard.items
        ])

    def decode(self, config: RunConfig, sample: Sample, repeats: int = 1) -> SampleRecord:
        """A live decode (SD or the AR baseline) on the configuration's engine; the fastest of
        `repeats` decodes, which must give the same output, with the machine's load before and
        after them (the report flags walltimes taken on an overloaded machine)."""
        load_before = machine_load()
        records = [self._decode_once(config, sample) for _ in range(repeats)]
        if any(r.error for r in records):
            return next(r for r in records if r.error)
        if any(r.output_ids != records[0].output_ids for r in records):
            err = RuntimeError(f"{repeats} decodes of one timed sample gave different outputs")
            return failed(sample.sample_id, records[0].mode, err)
        fastest = min(records, key=lambda r: r.time_total_s)
        return replace(fastest, load_before=load_before, load_after=machine_load())

    def _decode_once(self, config: RunConfig, sample: Sample) -> SampleRecord:
        mode = "ar" if config.decode.is_ar else "live"

        def decode(engine: str) -> SampleRecord:
            if config.decode.is_ar:
                return autoregressive_decode(
                    self.target, sample, max_new_tokens=config.decode.max_new_tokens,
                    temperature=config.decode.temperature, seed=config.decode.seed, engine=engine,
                )
            return speculative_decode(
                self.target, self.drafts[config.pair.draft], sample, config.decode, self.captioner, engine=engine,
            )

        try:
            record, note = self._on_engine(config, self._models(config), decode)
        except Exception as err:  # one sample under one configuration; the shard goes on
            return failed(sample.sample_id, mode, err)
        return noted(record, note)

    def _models(self, config: RunConfig, draft: str | None = None) -> tuple[LVLM, ...]:
        """The models a configuration decodes with: the target, and the draft of an SD configuration."""
        draft = draft or (None if config.decode.is_ar else config.pair.draft)
        return (self.target,) if draft is None else (self.target, self.drafts[draft])

    def _on_engine(self, config: RunConfig, models: tuple[LVLM, ...], run: Callable[[str], T]) -> tuple[T, str | None]:
        """`run(engine)` on the configuration's engine; returns its result and a note when it
        left the engine `auto` would pick. Under `auto`, a static-engine failure that is not the
        input's (nor memory) is retried on `eager`; if that works, this worker decodes on eager
        from then on (AR and SD alike, so their walltimes stay comparable) and logs it once.
        An engine the grid names is never swapped."""
        engine = self._engine(config, models)
        try:
            return run(engine), self._auto_note(config, models)
        except Exception as err:
            if config.decode_engine is not None or engine != "static" or error_category(err) != "model":
                raise
            result = run("eager")  # its own error, if it fails too, is the row's
            self._static_failure = f"static engine failed ({one_line(err)}); decoded on eager"
            log.warning("%s: %s, and so will every later decode of engine auto here", self.group.label, self._static_failure)
            return result, self._static_failure

    def _shadow_replay(self, items: Items, samples: dict[str, Sample], records: dict[tuple[RunConfig, str], SampleRecord]) -> None:
        """Score the live greedy SD rows by trace replay too and keep replay's accepted counts
        beside live's (`replay_accepted_per_block`): the report's check that replay-scored rows
        are what live decoding gives. The shard's own greedy AR decode, when it has one, is
        the traces' y. A replay that fails leaves the live row as it is."""
        checked = [(c, s) for c, s in items
                   if c.decode.greedy and not c.decode.is_ar and c.decode.verify.replayable and records[(c, s)].error is None]
        decoded = {(s, self._engine(c), c.decode.max_new_tokens): records[(c, s)] for c, s in items
                   if c.decode.is_ar and c.decode.greedy and records[(c, s)].error is None}
        for item, shadow in self._replay(checked, samples, decoded).items():
            if shadow.error is None:
                records[item].replay_accepted_per_block = shadow.accepted_per_block

    def _engine(self, config: RunConfig, models: tuple[LVLM, ...] | None = None) -> str:
        """The engine a configuration decodes on: the grid's, or under `auto` the device's
        default for `models` (default: the target alone), eager once static has failed here."""
        if config.decode_engine:
            return config.decode_engine
        return "eager" if self._static_failure else default_engine(*(models or (self.target,)))

    def _replay(
        self, items: Items, samples: dict[str, Sample], decoded: dict[tuple, SampleRecord] | None = None,
    ) -> dict[tuple[RunConfig, str], SampleRecord]:
        """Greedy items scored from one trace collection per sample (pipeline.decoding.replay):
        the target's greedy decode and teacher-forced pass once per engine, then one
        teacher-forced pass per draft. AR baseline rows are that greedy decode, so their
        walltime belongs to the engine that collected; `decoded`: greedy AR records already
        decoded, by (sample id, engine, max_new_tokens), to use as y. AR rows this leaves out
        (no SD configuration of their sample here) are decoded live by `run_shard`."""
        from pipeline.decoding.traces import TargetTrace, collect_traces, trace_target
        from pipeline.decoding.replay import replay

        by_sample: dict[str, list[RunConfig]] = defaultdict(list)
        for config, sample_id in items:
            by_sample[sample_id].append(config)
        records = {}
        for sample_id, configs in by_sample.items():
            sample, budget = samples[sample_id], max(c.decode.max_new_tokens for c in configs)
            batches: dict[tuple[str, str], list[RunConfig]] = defaultdict(list)  # (draft, the grid's engine)
            for config in configs:
                if not config.decode.is_ar:
                    batches[(config.pair.draft, config.engine)].append(config)
            target_traces: dict[str, TargetTrace | Exception] = {}  # engine -> the target's trace, shared by every draft

            def target_trace(engine: str) -> TargetTrace:
                if engine not in target_traces:
                    try:
                        target_traces[engine] = trace_target(self.target, sample, max_new_tokens=budget, engine=engine,
                                                             baseline=(decoded or {}).get((sample_id, engine, budget)))
                    except Exception as err:  # made once: every draft's rows of this sample on this engine fail
                        target_traces[engine] = err
                made = target_traces[engine]
                if isinstance(made, Exception):
                    raise made
                return made

            for (draft, _), mine in batches.items():
                letters = "".join(m for m in METHODS if any(m in c.decode.methods for c in mine))

                def collect(engine: str, draft: str = draft, letters: str = letters):
                    return collect_traces(self.target, self.drafts[draft], sample, letters, self.captioner,
                                          max_new_tokens=budget, engine=engine, target_trace=target_trace(engine))

                try:
                    traces, note = self._on_engine(mine[0], self._models(mine[0]), collect)
                except Exception as err:  # this draft's rows of this sample fail; the shard goes on
                    records.update({(c, sample_id): failed(sample_id, "replay", err) for c in mine})
                    continue
                for config in mine:
                    try:
                        records[(config, sample_id)] = noted(replay(traces, config.decode), note)
                    except Exception as err:  # one configuration of this sample
                        records[(config, sample_id)] = failed(sample_id, "replay", err)
            for config in configs:
                made = target_traces.get(self._engine(config)) if config.decode.is_ar and config.decode.greedy else None
                if isinstance(made, TargetTrace) and config.decode.max_new_tokens == budget:
                    records[(config, sample_id)] = noted(made.baseline, self._auto_note(config))  # the decode that made y
        return records

    def _auto_note(self, config: RunConfig, models: tuple[LVLM, ...] | None = None) -> str | None:
        """The static engine's failure, for a configuration that `auto` decodes on eager because of it."""
        models = models or self._models(config)
        moved = config.decode_engine is None and self._static_failure and default_engine(*models) == "static"
        return self._static_failure if moved else None


def noted(record: SampleRecord, note: str | None) -> SampleRecord:
    """`record` with `note` added to its fallback (a copy: baseline records serve several rows)."""
    if not note:
        return record
    return replace(record, fallback="; ".join(filter(None, (record.fallback, note))))


def remote_worker(
    group: ModelGroup, captioner: str | None, *, num_gpus: float, num_cpus: float, max_restarts: int = 2,
    drafting_methods: tuple[str, ...] = (), allow_text: bool = False, threads: int | None = None,
):
    """Start a `TargetWorker` actor. Ray restarts it up to `max_restarts` times and retries
    calls that were in flight when it died; the runner (`actors.runner`) re-dispatches beyond that."""
    import ray

    actor = ray.remote(TargetWorker).options(
        num_gpus=num_gpus, num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=max_restarts
    )
    return actor.remote(group, captioner, drafting_methods, allow_text, threads)
