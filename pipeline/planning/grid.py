"""The experiment grid's values: model pairs, configurations, work units and shards, the
expansion of a validated grid into them, and the keys that identify result rows.

Expansion normalises fields that cannot change a result (a policy on a single drafting
method, a window on the static policy, ...) and drops the duplicates this creates, so every
work unit is distinct. Keys hash exactly the fields that change results, so reruns and resumes
recognise finished rows. Grid files are read and validated by `pipeline.planning.grid_file`.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, replace
from functools import cached_property, lru_cache
from typing import Iterable

from pipeline.data.sample import FIRST_TURN
from pipeline.data.user_datasets import UserDataset
from pipeline.decoding.config import AR, DecodeConfig
from pipeline.decoding.verify_kinds import Chain, VerifySpec
from pipeline.drafting.methods import needs_captions
from pipeline.drafting.policies import StaticPolicy, WeightPolicy
from pipeline.models.lookup_names import drafts_with, replays
from pipeline.planning.catalog import Catalog  # noqa: F401  (grids are validated against it)

TINY_PREFIX = "tiny:"  # tiny random models built locally on each node (pipeline.models.tiny)
AUTO_ENGINE = "auto"  # the decoding core picks by device (pipeline.decoding.engine.default_engine)
ENGINE_CHOICES = (AUTO_ENGINE, "static", "eager")  # the core's, named so a grid validates without torch

class GridError(ValueError):
    """An invalid grid file; the message names the offending entry."""


@dataclass(frozen=True)
class Pair:
    """A target and its draft, loaded together on one device by one actor."""

    target: str
    draft: str
    dtype: str = "fp32"

    @property
    def label(self) -> str:
        return f"{self.target} <- {self.draft} ({self.dtype})"


@dataclass(frozen=True)
class ModelGroup:
    """A target in one dtype and every draft the grid pairs it with: what one actor loads, the
    target once, its decodes serving all these drafts (draft size as an axis, as in the paper)."""

    target: str
    dtype: str
    drafts: tuple[str, ...]

    @property
    def pairs(self) -> tuple[Pair, ...]:
        return tuple(Pair(self.target, draft, self.dtype) for draft in self.drafts)

    @property
    def label(self) -> str:
        return f"{self.target} <- {', '.join(self.drafts)} ({self.dtype})"


def model_groups(pairs: Iterable[Pair]) -> dict[Pair, ModelGroup]:
    """Each pair's group: pairs of one target and dtype share one, drafts in first-seen order."""
    drafts: dict[tuple[str, str], list[str]] = {}
    for pair in dict.fromkeys(pairs):
        drafts.setdefault((pair.target, pair.dtype), []).append(pair.draft)
    groups = {key: ModelGroup(*key, tuple(names)) for key, names in drafts.items()}
    return {pair: group for group in groups.values() for pair in group.pairs}


@dataclass(frozen=True)
class PolicyEntry:
    """A weight policy of the grid and the ensembles it runs on (None: every ensemble).

    The paper pairs policies with method sets (MT* = MT with the grid, MTCP* = MTCP with
    inverse-error weights); `methods:` on a policy says so instead of running every product.
    Single methods and AR take no weights, so a restriction never removes them.
    """

    policy: WeightPolicy
    methods: tuple[str, ...] | None = None

    def applies_to(self, methods: str) -> bool:
        return self.methods is None or len(methods) == 1 or methods == AR or methods in self.methods


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines one decoding result except the sample, a grid point: the pair,
    how it decodes (`decode`, the core's; the AR baseline's methods are `AR`), the captioner (when
    C is among the methods), the engine (outputs agree, walltimes do not) and the batch."""

    pair: Pair
    decode: DecodeConfig
    captioner: str | None = None
    engine: str = AUTO_ENGINE
    batch: int = 1  # requests decoded together (`pipeline.decoding.loop`); 1: one at a time
    prompt_format: str = "model"  # how a chat family's prompt is rendered (`PROMPT_FORMATS`)

    @property
    def decode_engine(self) -> str | None:
        """The engine to ask the decoding core for; None lets it pick by device."""
        return None if self.engine == AUTO_ENGINE else self.engine

    @property
    def replayable(self) -> bool:
        """Greedy replay scores it exactly: its tree follows y, its draft replays (`lookup_names.replays`)."""
        return self.decode.greedy and self.decode.verify.replayable and replays(self.pair.draft,
                                                                                 self.decode.verify.is_chain)

    def key(self) -> str:
        """Hash of what changes results (not the run name or mode; the engine: walltimes do)."""
        return _config_key(self)


def key_fields(config: RunConfig) -> dict:
    """What a configuration's key hashes. Every rule that keeps the keys of rows written by
    earlier versions is here, so those rows resume without being computed again:
    - the decoding knobs sit flat beside the pair, captioner and engine, as when they were
      RunConfig's own fields;
    - a batch of 1 hashes no `batch` (keys from before the batch axis), the `model` prompt format
      no `prompt_format` (LLaVA's and the embedded target's prompts were always theirs);
    - policies and verify kinds hash their `key_fields()`, except that a chain hashes no
      `verify` (its keys are those from before trees existed) and a candidate tree hashes
      null `nodes` and `top_k` (its keys from before verify kinds were classes)."""
    decode = config.decode
    verify = decode.verify.key_fields()
    if decode.verify.kind == "candidates":
        verify = verify | {"nodes": None, "top_k": None}
    fields = {"pair": asdict(config.pair), "captioner": config.captioner, "engine": config.engine,
              "methods": decode.methods, "gamma": decode.gamma, "temperature": decode.temperature,
              "seed": decode.seed, "max_new_tokens": decode.max_new_tokens,
              "policy": decode.policy.key_fields(), "verify": verify}
    if decode.verify.is_chain:
        del fields["verify"]
    if config.batch != 1:
        fields["batch"] = config.batch
    if config.prompt_format != "model":
        fields["prompt_format"] = config.prompt_format
    return fields


@lru_cache(maxsize=None)
def _config_key(config: RunConfig) -> str:
    # cached: planning asks once per (configuration, sample), and the JSON hash costs ~40 us
    payload = json.dumps(key_fields(config), sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def row_key(config_key: str, sample_id: str, prompt_hash: str) -> str:
    """The key of one result row: a configuration applied to one sample's prompt (its `prompt_hash`:
    the same id may carry another prompt on another run, e.g. a second turn from another answer)."""
    return hashlib.sha256(f"{config_key}|{sample_id}|{prompt_hash}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class WorkUnit:
    """One configuration on one dataset and turn; it covers every sample of that dataset."""

    config: RunConfig
    dataset: str
    turn: str


@dataclass(frozen=True)
class Shard:
    """A batch of rows for one actor: (configuration, sample id) items of one model group,
    dataset and turn. `mode` "replay" scores all greedy configurations of a sample from one
    set of traces; "live" decodes every item. The id hashes the row keys, so a rerun that
    plans the same rows finds the same file."""

    run: str
    group: ModelGroup
    dataset: str
    turn: str
    mode: str
    items: tuple[tuple[RunConfig, str], ...]
    prompt_hashes: tuple[tuple[str, str], ...]  # (sample id, prompt hash) of every sample in items
    timed: tuple[str, ...] = ()  # its samples chosen for walltime (pipeline.planning.timed_samples)

    @cached_property
    def keys(self) -> tuple[str, ...]:
        hashes = dict(self.prompt_hashes)
        return tuple(row_key(config.key(), sample_id, hashes[sample_id]) for config, sample_id in self.items)

    @cached_property
    def shard_id(self) -> str:
        return hashlib.sha256("|".join(sorted(self.keys)).encode()).hexdigest()[:16]

    @property
    def sample_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(sample_id for _, sample_id in self.items))


@dataclass(frozen=True)
class GridSpec:
    """A validated grid. Build it with `grid_file.load_grid` / `parse_grid`, not by hand."""

    name: str
    datasets: tuple[str, ...]
    turns: tuple[str, ...]
    pairs: tuple[Pair, ...]
    methods: tuple[str, ...]
    policies: tuple[PolicyEntry, ...]
    # each axis defaults to the one value the decoding configuration defaults to
    window: tuple[int | None, ...] = (WeightPolicy.window,)
    distance: tuple[str, ...] = (WeightPolicy.distance,)
    gamma: tuple[int, ...] = (DecodeConfig.gamma,)
    temperature: tuple[float, ...] = (DecodeConfig.temperature,)
    seed: tuple[int, ...] = (DecodeConfig.seed,)
    engine: tuple[str, ...] = (AUTO_ENGINE,)
    verify: tuple[VerifySpec, ...] = (Chain(),)
    batch: tuple[int, ...] = (1,)
    max_new_tokens: int = DecodeConfig.max_new_tokens
    limit: int | None = None
    captioner: str | None = None
    shard_size: int = 8
    mode: str = "live"
    #: with mode auto: first-turn samples per dataset whose greedy SD configs run live (walltime)
    live_samples: int = 0
    #: seeds the choice of those samples (spread over datasets and distinct images)
    live_seed: int = 0
    #: runs of a timed sample's live decodes, the fastest kept (noise only ever adds time)
    timed_repeats: int = 2
    #: measure each pair's latency ratios after the run (jobs/calibrate.py) for the speedup table
    calibrate: bool = False
    calibrate_rounds: int = 5  # rounds and timed steps per measurement: fewer are quicker, noisier
    calibrate_repeats: int = 10
    #: local copies (save_to_disk dir or Parquet) by dataset or question-task name: (name, path)
    sources: tuple[tuple[str, str], ...] = ()
    #: datasets the grid file names by path (pipeline.data.user_datasets); their names are in `datasets`
    user_datasets: tuple[UserDataset, ...] = ()
    text_only: tuple[Pair, ...] = ()  # pairs marked `text_only: true`: they may be plain causal LMs
    untimed: tuple[Pair, ...] = ()  # pairs marked `timed: false`: replayed on the `live_samples` too
    timed_only: tuple[Pair, ...] = ()  # pairs marked `timed: only`: they decode the `live_samples` alone
    #: (target, dtype, GPUs) of pairs given `gpus:`: their actor holds that many, the target spread over them
    spread: tuple[tuple[str, str, int], ...] = ()
    untimed_verify: tuple[VerifySpec, ...] = ()  # verify kinds marked `timed: false`, likewise
    # verify kinds given `methods:`, with the method sets they run on (the others: every one)
    verify_methods: tuple[tuple[VerifySpec, tuple[str, ...]], ...] = ()
    #: import paths of the grid's own drafting methods (pipeline.planning.plugins); workers import them too
    drafting_methods: tuple[str, ...] = ()
    max_image_pixels: int | None = None  # images above it are input errors (None: pipeline.data.images')
    prompt_format: str = "model"  # how chat families' prompts are rendered (`PROMPT_FORMATS`)

    @property
    def second_turns(self) -> tuple[str, ...]:
        return tuple(t for t in self.turns if t != FIRST_TURN)

    def configs(self) -> list[RunConfig]:
        """Every distinct grid point, in file order, after normalisation (a draft's sets: `drafts_with`).
        Greedy decoding draws nothing, so temperature 0 runs with the first seed only (its key hashes
        that seed: rows written under it resume; the others were the same work again)."""
        seen: dict[RunConfig, None] = {}
        only = dict(self.verify_methods)  # AR verifies nothing: a restriction never removes it
        runs = lambda verify, methods: methods == AR or methods in only.get(verify, (methods,))
        grid = itertools.product(
            self.pairs, self.methods, self.policies, self.window, self.distance, self.gamma,
            self.temperature, self.seed, self.engine, self.verify, self.batch,
        )
        for pair, methods, policy, window, distance, gamma, temperature, seed, engine, verify, batch in grid:
            greedy_repeat = temperature == 0 and seed != self.seed[0]
            drafted = methods == AR or drafts_with(pair.draft, methods, verify.runs_as_chain(len(methods)))
            if greedy_repeat or not drafted or not policy.applies_to(methods) or not runs(verify, methods):
                continue
            decode = DecodeConfig(methods, replace(policy.policy, window=window, distance=distance), gamma,
                                  temperature, self.max_new_tokens, seed, verify)
            config = RunConfig(pair, decode, self.captioner, engine, batch, self.prompt_format)
            seen.setdefault(normalise(config), None)
        return list(seen)

    def units(self, turns: Iterable[str] | None = None) -> list[WorkUnit]:
        """Work units of the given turns (all turns by default), pair-major so that one
        actor's units are contiguous."""
        wanted = self.turns if turns is None else tuple(turns)
        return [
            WorkUnit(config, dataset, turn)
            for config in self.configs()
            for turn in wanted
            for dataset in self.datasets
        ]


def normalise(config: RunConfig) -> RunConfig:
    """Reset fields that cannot change this configuration's result to their defaults, so
    equivalent grid points collapse into one work unit."""
    decode = config.decode
    if decode.is_ar:
        return replace(config, decode=replace(decode, policy=StaticPolicy(), gamma=None, verify=Chain()),
                       captioner=None)
    # one method: no weights
    policy = StaticPolicy() if len(decode.methods) == 1 else decode.policy.canonical()
    captioner = config.captioner if needs_captions(decode.methods) else None
    verify, gamma = decode.verify.settled(len(decode.methods), decode.gamma)
    return replace(config, decode=replace(decode, policy=policy, gamma=gamma, verify=verify),
                   captioner=captioner)
