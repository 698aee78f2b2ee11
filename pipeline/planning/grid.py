"""The experiment grid: a YAML file parsed, validated as a whole and expanded to work units.

Validation happens before Ray starts or any model or dataset loads, and every error names the
offending entry (e.g. `pairs[1].draft`). Expansion normalises fields that cannot change a result
(a policy on a single drafting method, a window on the static policy, ...) and drops the
duplicates this creates, so every work unit is distinct. Keys hash exactly the fields that
change results, so reruns and resumes recognise finished rows.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Collection, Iterable

import yaml

from pipeline.decoding.config import DISTANCES, DecodeConfig, PolicySpec
from pipeline.models.dtypes import DTYPES

AR = "AR"  # method-set name of the autoregressive baseline (rows with mode "ar")
FIRST_TURN = "first"
MODES = ("live", "replay", "auto")
TINY_PREFIX = "tiny:"  # tiny random models built locally on each node (pipeline.models.tiny)
TINY_MODELS = ("target", "draft", "next_target")
EMBEDDED_MODELS = ("embedded:target", "embedded:draft")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# Hub ids whose model class is LLaVA-NeXT, recognised without downloading their config.
NEXT_HUB_NAME = re.compile(r"llava-v1\.6|llava-next|llava_next", re.IGNORECASE)

AUTO_ENGINE = "auto"  # the decoding core picks by device (pipeline.decoding.engine.default_engine)
# The core's engines, named here so a grid validates without importing torch.
ENGINE_CHOICES = (AUTO_ENGINE, "static", "eager")

AXES = ("window", "distance", "gamma", "temperature", "seed", "engine")
FIELDS = {
    "name", "datasets", "turns", "pairs", "methods", "policies", *AXES,
    "max_new_tokens", "limit", "captioner", "shard_size", "mode", "live_samples", "sources", "calibrate",
}
QUESTION_TASKS = ("nq", "gsm8k")  # second-turn tasks that read a question dataset


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
class GridPolicy:
    """A weight policy of the grid and the ensembles it runs on (None: every ensemble).

    The paper pairs policies with method sets (MT* = MT with the grid, MTCP* = MTCP with
    inverse-error weights); `methods:` on a policy says so instead of running every product.
    Single methods and AR take no weights, so a restriction never removes them.
    """

    spec: PolicySpec
    methods: tuple[str, ...] | None = None

    def applies_to(self, methods: str) -> bool:
        return self.methods is None or len(methods) == 1 or methods == AR or methods in self.methods


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines one decoding result except the sample: a grid point."""

    pair: Pair
    methods: str  # letters of MTCP, or "AR"
    policy: PolicySpec = field(default_factory=PolicySpec)
    gamma: int | None = 5  # None for AR
    temperature: float = 0.0
    seed: int = 0
    max_new_tokens: int = 128
    captioner: str | None = None  # only when C is among the methods
    engine: str = AUTO_ENGINE  # auto | static | eager: outputs agree, walltimes do not

    @property
    def is_ar(self) -> bool:
        return self.methods == AR

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def method_label(self) -> str:
        """Paper notation: a dynamic (TABED) ensemble carries a star, e.g. `MT*`."""
        return self.methods + ("*" if self.policy.kind != "static" else "")

    @property
    def decode_engine(self) -> str | None:
        """The engine to ask the decoding core for; None lets it pick by device."""
        return None if self.engine == AUTO_ENGINE else self.engine

    def decode_config(self) -> DecodeConfig:
        if self.is_ar:
            raise ValueError("the AR baseline has no speculative decoding config")
        return DecodeConfig(
            methods=self.methods,
            policy=self.policy,
            gamma=self.gamma,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
        )

    def key(self) -> str:
        """Hash of every field that changes results (not the run name or decoding mode); the
        engine counts, since walltimes depend on it."""
        payload = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def row_key(config_key: str, sample_id: str) -> str:
    """The stable key of one result row: a configuration applied to one sample."""
    return hashlib.sha256(f"{config_key}|{sample_id}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class WorkUnit:
    """One configuration on one dataset and turn; it covers every sample of that dataset."""

    config: RunConfig
    dataset: str
    turn: str


@dataclass(frozen=True)
class Shard:
    """A batch of rows for one actor: (configuration, sample id) items of one pair, dataset
    and turn. `mode` "replay" scores all its greedy configurations of a sample from one set
    of traces; "live" decodes every item. The id hashes the row keys, so a rerun that plans
    the same rows finds the same file."""

    run: str
    pair: Pair
    dataset: str
    turn: str
    mode: str
    items: tuple[tuple[RunConfig, str], ...]

    @cached_property
    def keys(self) -> tuple[str, ...]:
        return tuple(row_key(config.key(), sample_id) for config, sample_id in self.items)

    @cached_property
    def shard_id(self) -> str:
        return hashlib.sha256("|".join(sorted(self.keys)).encode()).hexdigest()[:16]

    @property
    def sample_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(sample_id for _, sample_id in self.items))


@dataclass(frozen=True)
class Catalog:
    """The dataset names and second-turn tasks a grid may use (the data registry's)."""

    datasets: Collection[str]
    turn_tasks: Collection[str]

    @staticmethod
    def from_registry() -> "Catalog":
        from pipeline.data import DATASETS, TURN_TASKS

        return Catalog(datasets=tuple(DATASETS), turn_tasks=tuple(TURN_TASKS))


@dataclass(frozen=True)
class GridSpec:
    """A validated grid. Build it with `load_grid` / `parse_grid`, not by hand."""

    name: str
    datasets: tuple[str, ...]
    turns: tuple[str, ...]
    pairs: tuple[Pair, ...]
    methods: tuple[str, ...]
    policies: tuple[GridPolicy, ...]
    window: tuple[int | None, ...] = (None,)
    distance: tuple[str, ...] = ("kl",)
    gamma: tuple[int, ...] = (5,)
    temperature: tuple[float, ...] = (0.0,)
    seed: tuple[int, ...] = (0,)
    engine: tuple[str, ...] = (AUTO_ENGINE,)
    max_new_tokens: int = 128
    limit: int | None = None
    captioner: str | None = None
    shard_size: int = 8
    mode: str = "live"
    #: with mode auto: first-turn samples per dataset whose greedy SD configs run live (walltime)
    live_samples: int = 0
    #: measure each pair's latency ratios after the run (jobs/calibrate.py) for the speedup table
    calibrate: bool = False
    #: local copies (save_to_disk dir or Parquet) by dataset or question-task name, for
    #: clusters without hub access; (name, path) pairs so the spec stays hashable
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def second_turns(self) -> tuple[str, ...]:
        return tuple(t for t in self.turns if t != FIRST_TURN)

    def configs(self) -> list[RunConfig]:
        """Every distinct grid point, in file order, after normalisation."""
        seen: dict[RunConfig, None] = {}
        for pair, methods, policy, window, distance, gamma, temperature, seed, engine in itertools.product(
            self.pairs, self.methods, self.policies, self.window, self.distance, self.gamma,
            self.temperature, self.seed, self.engine,
        ):
            if not policy.applies_to(methods):
                continue
            config = RunConfig(
                pair=pair,
                methods=methods,
                policy=replace(policy.spec, window=window, distance=distance),
                gamma=gamma,
                temperature=temperature,
                seed=seed,
                max_new_tokens=self.max_new_tokens,
                captioner=self.captioner,
                engine=engine,
            )
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

    def counts(self) -> dict[str, Counter]:
        """Work-unit counts per dataset, turn, model pair, method set, policy and engine (for `--dry-run`)."""
        units = self.units()
        return {
            "dataset": Counter(u.dataset for u in units),
            "turn": Counter(u.turn for u in units),
            "pair": Counter(u.config.pair.label for u in units),
            "method set": Counter(u.config.methods for u in units),
            "policy": Counter(u.config.policy.label for u in units),
            "engine": Counter(u.config.engine for u in units),
        }


def normalise(config: RunConfig) -> RunConfig:
    """Reset fields that cannot change this configuration's result to their defaults, so
    equivalent grid points collapse into one work unit."""
    if config.is_ar:
        return replace(config, policy=PolicySpec(), gamma=None, captioner=None)
    if len(config.methods) == 1 or config.policy.kind == "static":
        policy = PolicySpec()
    elif config.policy.kind == "grid":
        kl_only = config.policy.measure in ("hard", "hard+soft")  # the distance is not used
        policy = replace(config.policy, temperature=1.0, distance="kl" if kl_only else config.policy.distance)
    else:  # inverse: the grid's measure and steps are not used
        policy = replace(config.policy, measure=PolicySpec.measure, steps=PolicySpec.steps)
    captioner = config.captioner if "C" in config.methods else None
    return replace(config, policy=policy, captioner=captioner)


# ---------------------------------------------------------------- parsing and validation


def load_grid(path: str | Path, catalog: Catalog | None = None) -> GridSpec:
    """Read and validate a grid file; `catalog` defaults to the data registry."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise GridError(f"cannot read grid file {path}: {err}") from err
    raw = raw if isinstance(raw, dict) else {}
    raw.setdefault("name", path.stem)
    return parse_grid(raw, catalog)


def parse_grid(raw: dict[str, Any], catalog: Catalog | None = None) -> GridSpec:
    """Validate a grid given as a mapping (the parsed YAML) and build the `GridSpec`."""
    if not isinstance(raw, dict):
        raise GridError("a grid must be a mapping of field: value")
    unknown = sorted(set(raw) - FIELDS)
    if unknown:
        raise GridError(f"unknown grid field(s) {unknown}; known: {sorted(FIELDS)}")
    for required in ("datasets", "pairs", "methods"):
        if required not in raw:
            raise GridError(f"grid field {required!r} is required")
    catalog = catalog or Catalog.from_registry()
    methods = _methods(raw["methods"])
    spec = GridSpec(
        name=_name(raw.get("name", "grid")),
        datasets=_datasets(raw["datasets"], catalog),
        turns=_turns(raw.get("turns", [FIRST_TURN]), catalog),
        pairs=tuple(_pair(entry, i) for i, entry in enumerate(_list(raw["pairs"], "pairs"))),
        methods=methods,
        policies=tuple(_policy(entry, i, methods) for i, entry in enumerate(_list(raw.get("policies", ["static"]), "policies"))),
        window=tuple(_window(w, i) for i, w in enumerate(_list(raw.get("window", [None]), "window"))),
        distance=tuple(_choice(d, DISTANCES, f"distance[{i}]") for i, d in enumerate(_list(raw.get("distance", ["kl"]), "distance"))),
        gamma=tuple(_int(g, f"gamma[{i}]", minimum=1) for i, g in enumerate(_list(raw.get("gamma", [5]), "gamma"))),
        temperature=tuple(_float(t, f"temperature[{i}]") for i, t in enumerate(_list(raw.get("temperature", [0.0]), "temperature"))),
        seed=tuple(_int(s, f"seed[{i}]", minimum=0) for i, s in enumerate(_list(raw.get("seed", [0]), "seed"))),
        engine=tuple(_engine(e, f"engine[{i}]") for i, e in enumerate(_list(raw.get("engine", [AUTO_ENGINE]), "engine"))),
        max_new_tokens=_int(raw.get("max_new_tokens", 128), "max_new_tokens", minimum=1),
        limit=None if raw.get("limit") is None else _int(raw["limit"], "limit", minimum=1),
        captioner=_captioner(raw.get("captioner")),
        shard_size=_int(raw.get("shard_size", 8), "shard_size", minimum=1),
        mode=_choice(raw.get("mode", "live"), MODES, "mode"),
        live_samples=_int(raw.get("live_samples", 0), "live_samples", minimum=0),
        sources=_sources(raw.get("sources") or {}),
        calibrate=_bool(raw.get("calibrate", False), "calibrate"),
    )
    _check_combinations(spec)
    return spec


def _sources(value: Any) -> tuple[tuple[str, str], ...]:
    """`sources: {docvqa: /data/docvqa, nq: /data/nq.parquet}`; every path must exist here."""
    if not isinstance(value, dict):
        raise GridError("grid field 'sources' must map dataset or task names to local paths")
    for name, path in value.items():
        if not isinstance(path, str) or not Path(path).expanduser().exists():
            raise GridError(f"sources.{name}: local copy {path!r} does not exist")
    return tuple(sorted((str(name), str(Path(path).expanduser())) for name, path in value.items()))


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise GridError(f"{where}: expected true or false, got {value!r}")
    return value


def _list(value: Any, where: str) -> list:
    """An axis may be written as a scalar or a list; an empty list is an error."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise GridError(f"grid field {where!r} is an empty list")
    return values


def _name(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[\w.\-]+", value):
        raise GridError(f"name {value!r}: use letters, digits, '.', '_' or '-' (it names a directory)")
    return value


def _datasets(value: Any, catalog: Catalog) -> tuple[str, ...]:
    names = _list(value, "datasets")
    for i, name in enumerate(names):
        if name not in catalog.datasets:
            raise GridError(f"datasets[{i}]: unknown dataset {name!r}; known: {sorted(catalog.datasets)}")
    return tuple(dict.fromkeys(names))


def _turns(value: Any, catalog: Catalog) -> tuple[str, ...]:
    turns = _list(value, "turns")
    for i, turn in enumerate(turns):
        if turn != FIRST_TURN and turn not in catalog.turn_tasks:
            raise GridError(
                f"turns[{i}]: unknown turn {turn!r}; use {FIRST_TURN!r} or a second-turn task of "
                f"{sorted(catalog.turn_tasks)}"
            )
    return tuple(dict.fromkeys(turns))


def model_kind(name: str) -> str:
    """`llava_next` when the model is known to be LLaVA-NeXT without loading it, else `other`."""
    if name == f"{TINY_PREFIX}next_target" or NEXT_HUB_NAME.search(name):
        return "llava_next"
    config = Path(name) / "config.json"
    if config.is_file():
        try:
            return json.loads(config.read_text()).get("model_type", "other")
        except (OSError, ValueError):
            return "other"
    return "other"


def check_model_id(name: Any, where: str) -> str:
    """A model is a hub id `org/name`, an existing local directory, `embedded:target|draft`
    or `tiny:target|draft|next_target`."""
    if not isinstance(name, str) or not name:
        raise GridError(f"{where}: a model must be a non-empty string, got {name!r}")
    if name.startswith("embedded:"):
        if name not in EMBEDDED_MODELS:
            raise GridError(f"{where}: unknown embedded model {name!r}; known: {list(EMBEDDED_MODELS)}")
        return name
    if name.startswith(TINY_PREFIX):
        if name[len(TINY_PREFIX):] not in TINY_MODELS:
            raise GridError(f"{where}: unknown tiny model {name!r}; known: {[TINY_PREFIX + m for m in TINY_MODELS]}")
        return name
    if Path(name).expanduser().is_dir():
        return name
    looks_local = name.startswith(("/", ".", "~")) or name.count("/") != 1
    if looks_local or not HUB_ID.fullmatch(name):
        raise GridError(
            f"{where}: {name!r} is neither an existing local directory nor a hub id 'org/name' "
            "(nor embedded:target|draft, tiny:target|draft|next_target)"
        )
    return name


def _pair(entry: Any, i: int) -> Pair:
    where = f"pairs[{i}]"
    if not isinstance(entry, dict):
        raise GridError(f"{where}: expected a mapping {{target, draft, dtype}}, got {entry!r}")
    unknown = sorted(set(entry) - {"target", "draft", "dtype"})
    if unknown:
        raise GridError(f"{where}: unknown key(s) {unknown}; known: target, draft, dtype")
    for key in ("target", "draft"):
        if key not in entry:
            raise GridError(f"{where}: missing {key!r}")
    return Pair(
        target=check_model_id(entry["target"], f"{where}.target"),
        draft=check_model_id(entry["draft"], f"{where}.draft"),
        dtype=_choice(entry.get("dtype", "fp32"), tuple(DTYPES), f"{where}.dtype"),
    )


def _methods(value: Any) -> tuple[str, ...]:
    sets = [str(m) for m in _list(value, "methods")]
    for i, methods in enumerate(sets):
        if methods == AR:
            continue
        try:
            DecodeConfig(methods=methods).validate()
        except ValueError as err:
            raise GridError(f"methods[{i}] {methods!r}: {err} (or {AR!r} for the autoregressive baseline)") from err
    return tuple(dict.fromkeys(sets))


POLICY_KEYS = {"kind", "measure", "temperature", "steps", "methods"}


def _policy(entry: Any, i: int, method_sets: tuple[str, ...]) -> GridPolicy:
    where = f"policies[{i}]"
    if isinstance(entry, str):
        entry = {"kind": entry}
    if not isinstance(entry, dict) or "kind" not in entry:
        raise GridError(f"{where}: expected a kind (static | grid | inverse) or a mapping with 'kind', got {entry!r}")
    entry = dict(entry)
    methods = entry.pop("methods", None)
    if methods is not None:
        methods = tuple(str(m) for m in _list(methods, f"{where}.methods"))
        for m in methods:
            if m not in method_sets or len(m) < 2 or m == AR:
                raise GridError(f"{where}.methods: {m!r} is not an ensemble of this grid's methods {list(method_sets)}")
    unknown = sorted(set(entry) - POLICY_KEYS)
    if unknown:
        raise GridError(f"{where}: unknown key(s) {unknown}; known: {sorted(POLICY_KEYS)} (window and distance are grid axes)")
    if entry["kind"] != "grid" and "measure" in entry:
        raise GridError(f"{where}: 'measure' applies to the grid policy only")
    if entry["kind"] != "inverse" and "temperature" in entry:
        raise GridError(f"{where}: 'temperature' applies to the inverse policy only")
    try:
        spec = PolicySpec(**entry)
        spec.validate()
    except (TypeError, ValueError) as err:
        raise GridError(f"{where}: {err}") from err
    return GridPolicy(spec, methods)


def _window(value: Any, i: int) -> int | None:
    if value is None or (isinstance(value, str) and value.upper() == "ALL"):
        return None
    return _int(value, f"window[{i}]", minimum=1)


def _engine(value: Any, where: str) -> str:
    if value not in ENGINE_CHOICES:
        raise GridError(f"{where}: unknown engine {value!r}; choose one of {', '.join(ENGINE_CHOICES)}")
    return value


def _choice(value: Any, choices: Iterable[str], where: str) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise GridError(f"{where}: {value!r} is not one of {list(choices)}")
    return value


def _int(value: Any, where: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise GridError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise GridError(f"{where}: expected a number >= 0, got {value!r}")
    return float(value)


def _captioner(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise GridError(f"captioner: expected a name (embedded, a hub id or a directory), got {value!r}")
    return value


def _check_combinations(spec: GridSpec) -> None:
    """Combinations no single field can rule out."""
    if spec.live_samples and spec.mode != "auto":
        raise GridError(f"live_samples: {spec.live_samples} only applies to mode 'auto' (mode is {spec.mode!r})")
    for name, _ in spec.sources:
        if name not in spec.datasets and not (name in QUESTION_TASKS and name in spec.turns):
            raise GridError(f"sources.{name}: not a dataset or question task ({', '.join(QUESTION_TASKS)}) of this grid")
    for i, methods in enumerate(spec.methods):
        if not any(policy.applies_to(methods) for policy in spec.policies):
            raise GridError(f"methods[{i}] {methods!r}: no policy runs on it (every policy's 'methods' names other ensembles)")
        if "C" in methods and spec.captioner is None:
            raise GridError(f"methods[{i}] {methods!r} uses caption drafting (C) but the grid sets no captioner")
        if "P" in methods:
            for j, pair in enumerate(spec.pairs):
                if model_kind(pair.draft) == "llava_next":
                    raise GridError(
                        f"methods[{i}] {methods!r} with pairs[{j}].draft {pair.draft!r}: pooled drafting (P) "
                        "needs a LLaVA-1.5 style draft, not LLaVA-NeXT"
                    )
    if spec.second_turns:
        if FIRST_TURN not in spec.turns:
            raise GridError(
                f"turns {list(spec.second_turns)} build on the target's first-turn answers: add {FIRST_TURN!r} to turns"
            )
        if 0.0 not in spec.temperature:
            raise GridError(
                f"turns {list(spec.second_turns)} need the target's greedy first-turn answers: add 0 to temperature"
            )
    if spec.mode == "replay" and any(t > 0 for t in spec.temperature):
        raise GridError("mode 'replay' scores greedy configurations only; use 'auto' to run temperature > 0 live")
    for config in spec.configs():
        if not config.is_ar:
            try:
                config.decode_config().validate()
            except ValueError as err:
                raise GridError(f"configuration {config.methods} / {config.policy.label} on {config.pair.label}: {err}") from err
