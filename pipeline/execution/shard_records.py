"""One shard's records on one target and its drafts, below Ray: what a worker computes.

Drafts share the target's decodes: per sample and engine, one greedy decode of the target and
one teacher-forced target pass serve every draft, and the AR baseline is decoded once for all
of them. Replayed shards score greedy configurations from traces; live shards decode, and
their greedy SD rows are replayed too, as the check that replay gives what live decoding
gives. Under engine `auto` a static engine that fails for the model's sake is retried on eager.
One bad sample is one error record; the shard goes on.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import replace
from typing import Callable, Sequence, TypeVar

from pipeline.data.sample import Sample
from pipeline.decoding.engine import default_engine
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.decoding.inputs import tokenize
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.replay import replay
from pipeline.decoding.traces import TargetTrace, collect_traces, trace_target
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.methods import METHODS
from pipeline.execution.failures import error_category, failed, noted
from pipeline.models.base import LVLM
from pipeline.models.devices import machine_load
from pipeline.models.hf import one_line
from pipeline.planning.grid import GridSpec, RunConfig, Shard

Item = tuple[RunConfig, str]  # (configuration, sample id)
Records = dict[Item, SampleRecord]
T = TypeVar("T")
WARM_UP_TOKENS = 4  # a warm-up decode's length: every kind of step runs at least once
log = logging.getLogger(__name__)


class ShardRecords:
    """The records of shards of one target (`drafts`: by name), decoded on the models' device;
    a timed sample's live decodes run in `timed_repeats` rounds, the fastest of each kept."""

    def __init__(self, target: LVLM, drafts: dict[str, LVLM], captioner: Captioner | None = None,
                 timed_repeats: int = GridSpec.timed_repeats) -> None:
        self.target, self.drafts, self.captioner = target, drafts, captioner
        self.timed_repeats = timed_repeats
        # why the static engine failed here, once it has: `engine: auto` then decodes on eager
        self._static_failure: str | None = None
        self._warm = False  # whether this process's first timed sample has had its warm-up round

    def of(self, shard: Shard, samples: dict[str, Sample]) -> Records:
        """A record for every item of the shard, its models prompted in the grid's format."""
        for model in (self.target, *self.drafts.values()):
            model.prompt_format = shard.items[0][0].prompt_format  # one per grid
        records = self._replay(shard.items, samples) if shard.mode == "replay" else {}
        records |= self._batches([item for item in shard.items if item[0].batch > 1], samples)
        live = [item for item in shard.items if item not in records]
        for sample_id in dict.fromkeys(sample_id for _, sample_id in live):
            repeats = self.timed_repeats if sample_id in shard.timed else 1
            warm_up = sample_id in shard.timed and not self._warm
            self._warm |= warm_up
            items = [item for item in live if item[1] == sample_id]
            records |= self._decoded(items, samples[sample_id], repeats, warm_up)
        if shard.mode == "live":
            self._shadow_replay(shard.items, samples, records)
        return records

    def _batches(self, items: Sequence[Item], samples: dict[str, Sample]) -> Records:
        """Each configuration's samples B at a time, in shard order, as one batch each
        (`pipeline.decoding.loop`); a sample refused as input is an error row and the rest
        of its batch decodes without it; a batch that fails fails its rows."""
        by_config: dict[RunConfig, list[str]] = defaultdict(list)
        for config, sample_id in items:
            by_config[config].append(sample_id)
        records: Records = {}
        for config, ids in by_config.items():
            mode = "ar" if config.decode.is_ar else "live"
            for start in range(0, len(ids), config.batch):
                batch = []
                for sample_id in ids[start : start + config.batch]:
                    try:
                        tokenize(self.target, samples[sample_id])
                        batch.append(samples[sample_id])
                    except Exception as err:  # this sample's input; its batch goes on without it
                        records[(config, sample_id)] = failed(sample_id, mode, err)
                if not batch:
                    continue
                decode = lambda engine, config=config, batch=batch: self._batch(config, batch, engine)
                try:
                    done, note = self._on_engine(config, self._models(config), decode)
                except Exception as err:
                    done, note = [failed(s.sample_id, mode, err) for s in batch], None
                records.update({(config, s.sample_id): noted(r, note) for s, r in zip(batch, done)})
        return records

    def _batch(self, config: RunConfig, batch: list[Sample], engine: str) -> list[SampleRecord]:
        """One batch of a configuration of `batch` > 1 (a dataset's last may hold fewer, even one)."""
        records = self._decode(config, batch, engine)
        for record in records:
            record.batch_requests = len(batch)
        return records

    def _decode(self, config: RunConfig, samples: list[Sample], engine: str) -> list[SampleRecord]:
        """SD, or the AR baseline, of `samples` as one batch on `engine`."""
        decode = config.decode
        if decode.is_ar:
            return autoregressive_decode(self.target, samples, max_new_tokens=decode.max_new_tokens,
                                         temperature=decode.temperature, seed=decode.seed, engine=engine)
        return speculative_decode(self.target, self.drafts[config.pair.draft], samples, decode,
                                  self.captioner, engine=engine)

    def _decoded(self, items: Sequence[Item], sample: Sample, repeats: int, warm_up: bool = False) -> Records:
        """One sample's live decodes (SD, and the AR baseline once for every pair's AR row), in
        `repeats` rounds over all of them, AR first, the fastest of each kept (a timed sample's).
        Rounds, not runs back to back: a burst of load on the machine (a process starting beside
        the worker) slows the decodes of one round, not every run of the configuration it hit.
        Runs must give the same output; each record has the machine's load before its first
        run and after its last (the report flags walltimes taken on an overloaded machine).
        `warm_up` (a process's first timed sample): first a round short and untimed, since a
        process's first decodes pay one-time costs (memory the allocator first takes from the
        system, thread pools starting, kernels chosen for new shapes) that belong to no
        configuration, and fell on the first timed one, the AR baseline (its prefill took 0.5
        to 5.8 s where the others' took 0.25 s)."""
        # keyed once, before decoding: a static engine failing on the way changes what `auto` resolves to
        ar_first = sorted(items, key=lambda item: not item[0].decode.is_ar)
        keys = {item: self._decode_key(*item) for item in ar_first}
        first: dict[tuple, Item] = {}
        for item, key in keys.items():
            first.setdefault(key, item)
        if warm_up:
            for config, _ in first.values():
                short = replace(config.decode, max_new_tokens=WARM_UP_TOKENS)
                self._decode_once(replace(config, decode=short), sample)
        runs: dict[tuple, list[SampleRecord]] = defaultdict(list)
        before, after = {}, {}
        for round_ in range(repeats):
            for key, (config, _) in first.items():
                if round_ == 0:
                    before[key] = machine_load()
                runs[key].append(self._decode_once(config, sample))
                if round_ == repeats - 1:
                    after[key] = machine_load()
        kept = {key: self._fastest(runs[key], before[key], after[key]) for key in first}
        return {item: kept[keys[item]] for item in items}

    def _decode_key(self, config: RunConfig, sample_id: str) -> tuple:
        """What a live decode depends on: AR is the target alone, so one decode serves every draft's row."""
        decode = config.decode
        if decode.is_ar:
            return sample_id, self._engine(config), decode.max_new_tokens, decode.temperature, decode.seed
        return config, sample_id

    @staticmethod
    def _fastest(records: list[SampleRecord], load_before: float | None,
                 load_after: float | None) -> SampleRecord:
        if any(r.error for r in records):
            return next(r for r in records if r.error)
        if any(r.output_ids != records[0].output_ids for r in records):
            err = RuntimeError(f"{len(records)} decodes of one timed sample gave different outputs")
            return failed(records[0].sample_id, records[0].mode, err)
        fastest = min(records, key=lambda r: r.time_total_s)
        return replace(fastest, load_before=load_before, load_after=load_after)

    def _decode_once(self, config: RunConfig, sample: Sample) -> SampleRecord:
        on = lambda engine: self._decode(config, [sample], engine)[0]
        try:
            record, note = self._on_engine(config, self._models(config), on)
        except Exception as err:  # one sample under one configuration; the shard goes on
            return failed(sample.sample_id, "ar" if config.decode.is_ar else "live", err)
        return noted(record, note)

    def _shadow_replay(self, items: Sequence[Item], samples: dict[str, Sample], records: Records) -> None:
        """Score the live greedy SD rows by trace replay too and keep replay's accepted counts
        beside live's (`replay_accepted_per_block`): the report's check that replay-scored rows
        are what live decoding gives. The shard's own greedy AR decode, when it has one, is
        the traces' y. A replay that fails leaves the live row as it is."""
        checked = [(c, s) for c, s in items
                   if c.replayable and not c.decode.is_ar and records[(c, s)].error is None]
        decoded = {(s, self._engine(c), c.decode.max_new_tokens): records[(c, s)] for c, s in items
                   if c.decode.is_ar and c.decode.greedy and records[(c, s)].error is None}
        for item, shadow in self._replay(checked, samples, decoded).items():
            if shadow.error is None:
                records[item].replay_accepted_per_block = shadow.accepted_per_block

    def _replay(self, items: Sequence[Item], samples: dict[str, Sample],
                decoded: dict[tuple, SampleRecord] | None = None) -> Records:
        """Greedy items scored from one trace collection per sample (pipeline.decoding.replay).
        `decoded`: greedy AR records already decoded, by (sample id, engine, max_new_tokens),
        to use as y. AR rows this leaves out (no SD configuration of their sample here) are
        decoded live by `of`."""
        by_sample: dict[str, list[RunConfig]] = defaultdict(list)
        for config, sample_id in items:
            by_sample[sample_id].append(config)
        records: Records = {}
        for sample_id, configs in by_sample.items():
            records |= self._replay_sample(samples[sample_id], configs, decoded or {})
        return records

    def _replay_sample(self, sample: Sample, configs: list[RunConfig],
                       decoded: dict[tuple, SampleRecord]) -> Records:
        """One sample's greedy configurations: the target's greedy decode and teacher-forced pass
        once per engine, then one teacher-forced pass per draft. AR rows are that greedy decode,
        so their walltime belongs to the engine that collected."""
        sample_id, budget = sample.sample_id, max(c.decode.max_new_tokens for c in configs)
        # engine -> the target's trace, shared by every draft
        target_traces: dict[str, TargetTrace | Exception] = {}

        def target_trace(engine: str) -> TargetTrace:
            if engine not in target_traces:
                try:
                    y = decoded.get((sample_id, engine, budget))
                    target_traces[engine] = trace_target(self.target, sample, max_new_tokens=budget,
                                                         engine=engine, baseline=y)
                except Exception as err:  # made once: every draft's rows of this sample on this engine fail
                    target_traces[engine] = err
            made = target_traces[engine]
            if isinstance(made, Exception):
                raise made
            return made

        by_draft: dict[tuple[str, str], list[RunConfig]] = defaultdict(list)  # (draft, the grid's engine)
        for config in configs:
            if not config.decode.is_ar:
                by_draft[(config.pair.draft, config.engine)].append(config)
        records: Records = {}
        for (draft, _), mine in by_draft.items():
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
            greedy_ar = config.decode.is_ar and config.decode.greedy
            made = target_traces.get(self._engine(config)) if greedy_ar else None
            if isinstance(made, TargetTrace) and config.decode.max_new_tokens == budget:
                # the decode that made y
                records[(config, sample_id)] = noted(made.baseline, self._auto_note(config))
        return records

    def _models(self, config: RunConfig) -> tuple[LVLM, ...]:
        """The models a configuration decodes with: the target, and the draft of an SD configuration."""
        return (self.target,) if config.decode.is_ar else (self.target, self.drafts[config.pair.draft])

    def _engine(self, config: RunConfig, models: tuple[LVLM, ...] | None = None) -> str:
        """The engine a configuration decodes on: the grid's, or under `auto` the device's
        default for `models` (default: the target alone), eager once static has failed here."""
        if config.decode_engine:
            return config.decode_engine
        return "eager" if self._static_failure else default_engine(*(models or (self.target,)))

    def _on_engine(self, config: RunConfig, models: tuple[LVLM, ...],
                   run: Callable[[str], T]) -> tuple[T, str | None]:
        """`run(engine)` on the configuration's engine; returns its result and a note when it
        left the engine `auto` would pick. Under `auto`, a static-engine failure that is not the
        input's (nor memory) is retried on `eager`; if that works, decodes here go on eager from
        then on (AR and SD alike, so their walltimes stay comparable), logged once. An engine
        the grid names is never swapped."""
        engine = self._engine(config, models)
        try:
            return run(engine), self._auto_note(config, models)
        except Exception as err:
            if config.decode_engine is not None or engine != "static" or error_category(err) != "model":
                raise
            result = run("eager")  # its own error, if it fails too, is the row's
            self._static_failure = f"static engine failed ({one_line(err)}); decoded on eager"
            log.warning("%s: %s, and so will every later decode of engine auto here", self.target.name,
                        self._static_failure)
            return result, self._static_failure

    def _auto_note(self, config: RunConfig, models: tuple[LVLM, ...] | None = None) -> str | None:
        """The static engine's failure, for a configuration that `auto` decodes on eager because of it."""
        models = models or self._models(config)
        moved = config.decode_engine is None and self._static_failure and default_engine(*models) == "static"
        return self._static_failure if moved else None
