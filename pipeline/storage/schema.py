"""The result row, defined once: every column's name, Arrow type and where its value comes from.

The Parquet schema (`SCHEMA`) and the row builder (`make_row`) are both read off `COLUMNS`, so
adding a column is one line here. Fields a configuration does not use are null (e.g. `gamma`
for AR, `measure` unless the policy is a grid).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

import pyarrow as pa

from pipeline.data.sample import Sample
from pipeline.decoding.records import SampleRecord
from pipeline.planning.grid import RunConfig, row_key

PARTITIONS = ("run", "target", "draft", "dataset")  # hive directory levels, in order (pipeline.storage.store)


@dataclass(frozen=True)
class RowSource:
    """What one row is made of: where it ran, its grid point, its sample and the engine's record."""

    run: str
    shard: str
    config: RunConfig
    sample: Sample
    record: SampleRecord
    timed: bool = False  # the sample is one of its pair's walltime samples
    # what the worker timed on: device_name, torch_version, transformers_version,
    # cpu_cores (pipeline.models.devices)
    environment: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def config_key(self) -> str:
        return self.config.key()

    @cached_property
    def outcome(self) -> dict:
        return self.record.to_row()

    @property
    def dynamic(self) -> bool:
        return self.config.decode.policy.dynamic


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    value: Callable[[RowSource], Any]


def _sample(field: str) -> Callable[[RowSource], Any]:
    return lambda src: getattr(src.sample, field)


def _decode(field: str) -> Callable[[RowSource], Any]:
    return lambda src: getattr(src.config.decode, field)


def _outcome(field: str) -> Callable[[RowSource], Any]:
    return lambda src: src.outcome[field]


def _tau(src: RowSource) -> float | None:
    tau = src.outcome["tau"]
    return None if math.isnan(tau) else tau


def _tpot(src: RowSource) -> float | None:
    """Time per output token after the first: the request's latency less its time to first
    token, over the tokens that came after it; None without both times or a second token."""
    outcome = src.outcome
    first, tokens = outcome.get("time_first_token_s"), outcome["new_tokens"]
    latency = outcome.get("time_request_s") or outcome["time_wall_s"]
    if first is None or not latency or tokens < 2:
        return None
    return (latency - first) / (tokens - 1)


def _verify_column(src: RowSource, name: str) -> Any:
    return None if src.config.decode.is_ar else src.config.decode.verify.columns()[name]


def _block_shapes(src: RowSource) -> list[list[int]] | None:
    decode = src.config.decode
    return (None if decode.is_ar
            else [list(s) for s in decode.verify.block_shapes(decode.gamma, len(decode.methods))])


COLUMNS: tuple[Column, ...] = (
    # configuration + prompt
    Column("key", pa.string(),
           lambda src: row_key(src.config_key, src.sample.sample_id, src.sample.prompt_hash)),
    Column("config_key", pa.string(), lambda src: src.config_key),  # hash of the configuration alone
    Column("shard", pa.string(), lambda src: src.shard),
    Column("run", pa.string(), lambda src: src.run),
    Column("target", pa.string(), lambda src: src.config.pair.target),
    Column("draft", pa.string(), lambda src: src.config.pair.draft),
    Column("dataset", pa.string(), _sample("dataset")),
    Column("dtype", pa.string(), lambda src: src.config.pair.dtype),
    Column("sample_id", pa.string(), _sample("sample_id")),
    # prompt text + image pixels (Sample.prompt_hash)
    Column("prompt_hash", pa.string(), _sample("prompt_hash")),
    # chosen for walltime (pipeline.planning.timed_samples)
    Column("timed", pa.bool_(), lambda src: src.timed),
    Column("image_conversions", pa.list_(pa.string()), lambda src: list(src.sample.image_conversions)),
    Column("split", pa.string(), _sample("split")),
    Column("row", pa.int64(), _sample("row")),
    Column("turn", pa.string(), _sample("turn")),
    Column("category", pa.string(), _sample("category")),
    Column("answer", pa.string(), _sample("answer")),  # the dataset's reference answer, where it has one
    Column("source_id", pa.string(), _sample("source_id")),  # the row's id in its dataset (MMSpec's `id`)
    Column("methods", pa.string(), _decode("methods")),  # letters of MTCP, or AR
    Column("method_label", pa.string(), _decode("method_label")),  # paper notation: MT, MT*, MTCP* ...
    # static | grid(<measure>) | inverse(T=<t>)
    Column("policy", pa.string(), lambda src: src.config.decode.policy.label),
    Column("policy_kind", pa.string(), lambda src: src.config.decode.policy.kind),
    # a policy's own knobs, null where it has none of that name (measure: grid; temperature: inverse)
    Column("measure", pa.string(), lambda src: getattr(src.config.decode.policy, "measure", None)),
    Column("policy_temperature", pa.float64(),
           lambda src: getattr(src.config.decode.policy, "temperature", None)),
    # null = ALL history
    Column("window", pa.int32(), lambda src: src.config.decode.policy.window if src.dynamic else None),
    Column("distance", pa.string(), lambda src: src.config.decode.policy.distance if src.dynamic else None),
    Column("gamma", pa.int32(), _decode("gamma")),  # null for AR
    # chain | candidates | dynamic(n=..,k=..): how the target verified
    # (null for AR and rows from before trees)
    Column("verify", pa.string(),
           lambda src: None if src.config.decode.is_ar else src.config.decode.verify.label),
    # the same as structured columns, which reports read (pipeline.planning.verify_entries.verify_of_row)
    Column("verify_kind", pa.string(), lambda src: _verify_column(src, "verify_kind")),
    Column("verify_nodes", pa.int32(), lambda src: _verify_column(src, "verify_nodes")),
    Column("verify_top_k", pa.int32(), lambda src: _verify_column(src, "verify_top_k")),
    Column("verify_shapes", pa.list_(pa.list_(pa.int32())), lambda src: _verify_column(src, "verify_shapes")),
    # every knob of the kind as JSON, and the (draft steps, nodes, draft rows) of each block shape it
    # may use: what reports cost a block with, for a kind of your own too, without importing it
    Column("verify_knobs", pa.string(), lambda src: _verify_column(src, "verify_knobs")),
    Column("verify_block_shapes", pa.list_(pa.list_(pa.int32())), lambda src: _block_shapes(src)),
    Column("temperature", pa.float64(), _decode("temperature")),
    Column("seed", pa.int64(), _decode("seed")),
    Column("max_new_tokens", pa.int32(), _decode("max_new_tokens")),
    Column("captioner", pa.string(), lambda src: src.config.captioner),
    Column("mode", pa.string(), _outcome("mode")),  # live | replay | ar
    # static | eager: what decoded (replay: what collected the traces); for an error row, what the grid named
    Column("engine", pa.string(), lambda src: src.record.engine or src.config.decode_engine),
    # requests decoded together in one batch (null: rows from before the batch axis, decoded one at a time)
    Column("batch", pa.int32(), lambda src: src.config.batch),
    # how many requests that batch held (a dataset's last batch may hold fewer; null: decoded alone)
    Column("batch_requests", pa.int32(), _outcome("batch_requests")),
    # how the decode steps ran: captured (CUDA graphs) | compiled | uncompiled, "+"-joined when mixed
    Column("steps", pa.string(), _outcome("steps")),
    # why a decode left the compiled path or engine asked for
    Column("fallback", pa.string(), _outcome("fallback")),
    # what walltimes were measured on; reports never pool timings across these (pipeline.reports.report)
    Column("device_name", pa.string(), lambda src: src.environment.get("device_name")),
    Column("torch_version", pa.string(), lambda src: src.environment.get("torch_version")),
    Column("transformers_version", pa.string(), lambda src: src.environment.get("transformers_version")),
    # the machine's, as its load counts them
    Column("cpu_cores", pa.int32(), lambda src: src.environment.get("cpu_cores")),
    # 1-minute load average before and after a live decode (null for replay rows)
    Column("load_before", pa.float64(), _outcome("load_before")),
    Column("load_after", pa.float64(), _outcome("load_after")),
    Column("accepted_per_block", pa.list_(pa.int32()), _outcome("accepted_per_block")),
    # live greedy rows: the accepted counts trace replay gives the same sample (pipeline.reports.fidelity)
    Column("replay_accepted_per_block", pa.list_(pa.int32()), _outcome("replay_accepted_per_block")),
    Column("weights_per_block", pa.list_(pa.list_(pa.float64())), _outcome("weights_per_block")),
    # a bandit tree's rows: which of `verify_shapes` each block used (empty otherwise)
    Column("shape_per_block", pa.list_(pa.int32()), _outcome("shape_per_block")),
    Column("blocks", pa.int32(), _outcome("blocks")),
    Column("tau", pa.float64(), _tau),  # per sample; aggregates pool blocks (pipeline.reports.report)
    # tau - 1: accepted drafts per block, the convention of EAGLE and ViSpec (pipeline.reports.acceptance)
    Column("tau0", pa.float64(), lambda src: None if _tau(src) is None else _tau(src) - 1),
    Column("new_tokens", pa.int32(), _outcome("new_tokens")),
    Column("output_ids", pa.list_(pa.int32()), _outcome("output_ids")),
    Column("output_text", pa.string(), _outcome("output_text")),
    Column("time_prefill_s", pa.float64(), _outcome("time_prefill_s")),
    Column("time_draft_s", pa.float64(), _outcome("time_draft_s")),
    Column("time_verify_s", pa.float64(), _outcome("time_verify_s")),
    Column("time_total_s", pa.float64(), _outcome("time_total_s")),
    # weights, mixing, history scoring: part of draft + verify
    Column("time_tabed_s", pa.float64(), _outcome("time_tabed_s")),
    Column("time_tabed_draft_s", pa.float64(), _outcome("time_tabed_draft_s")),  # the part inside draft
    # inside prefill: each model's prefill, and image features and captions inside those
    Column("time_vision_s", pa.float64(), _outcome("time_vision_s")),
    Column("time_target_prefill_s", pa.float64(), _outcome("time_target_prefill_s")),
    Column("time_draft_prefill_s", pa.float64(), _outcome("time_draft_prefill_s")),
    Column("time_wall_s", pa.float64(), _outcome("time_wall_s")),  # the whole decode, host overhead included
    # live and AR rows: this request's latency within its batch (decoded alone: time_wall_s), and
    # the new tokens of its whole batch per second of time_total_s
    Column("time_request_s", pa.float64(), _outcome("time_request_s")),
    Column("batch_tokens_per_s", pa.float64(), _outcome("batch_tokens_per_s")),
    # live and AR rows: time to first token (the prefill and, for SD, the first block), and time
    # per output token after it, (request latency - ttft) / (new tokens - 1): SD's bursts spread
    # over the tokens they deliver, as serving benchmarks define it
    Column("ttft_s", pa.float64(), _outcome("time_first_token_s")),
    # the target's prompt tokens and the prompt's images: acceptance by prompt length and images
    Column("prompt_tokens", pa.int32(), _outcome("prompt_tokens")),
    Column("images", pa.int32(), lambda src: len(src.sample.images)),
    Column("tpot_s", pa.float64(), _tpot),
    # the GPU's energy for this request (NVML; its share of its batch's by new tokens); null where
    # unmeasured (a CPU, no pynvml), never 0
    Column("energy_j", pa.float64(), _outcome("energy_j")),
    Column("error", pa.string(), _outcome("error")),  # null when the sample decoded fine
    # input | model | resource (records.py)
    Column("error_category", pa.string(), _outcome("error_category")),
)
# Results written before `engine` and `time_tabed_s` existed still read: a dataset read with
# this schema fills columns a file lacks with nulls.
SCHEMA = pa.schema([(column.name, column.type) for column in COLUMNS])
# What a Parquet file holds: the partition columns live in its directory names only, as hive
# readers (pyarrow.dataset, pandas, DuckDB, polars) expect, so each of them reads the results.
FILE_SCHEMA = pa.schema([field for field in SCHEMA if field.name not in PARTITIONS])


def make_row(run: str, shard: str, config: RunConfig, sample: Sample, record: SampleRecord,
             timed: bool = False, environment: Mapping[str, Any] | None = None) -> dict:
    """One result row: the grid fields, the sample's identity, the engine's record and where it ran."""
    source = RowSource(run, shard, config, sample, record, timed, environment or {})
    return {column.name: column.value(source) for column in COLUMNS}
