"""Grid files: YAML parsed and validated as a whole before Ray starts or any model or dataset
loads. Every error names the offending entry (e.g. `pairs[1].draft`); nothing in the file is
executed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


from pipeline.data.user_datasets import local_path
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.verify_kinds import VerifySpec
from pipeline.drafting.methods import METHODS
from pipeline.drafting.policies import DISTANCES, POLICIES, WeightPolicy
from pipeline.models.dtypes import DTYPES
from pipeline.models.families import PROMPT_FORMATS
from pipeline.names import did_you_mean
from pipeline.planning.grid import (
    AR, ENGINE_CHOICES, FIRST_TURN, GridError, GridSpec, PolicyEntry, Pair,
)
from pipeline.planning.catalog import Catalog
from pipeline.planning.grid_bounds import (
    MAX_BATCH, MAX_CONFIGURATIONS, MAX_GAMMA, MAX_GPUS_PER_WORKER, MAX_IMAGE_PIXELS, MAX_NEW_TOKENS,
    MAX_REPEATS, MAX_SAMPLES, MAX_SEED, MAX_TEMPERATURE, check_name, check_size,
)
from pipeline.planning.grid_checks import AXES, check_combinations
from pipeline.planning.grid_values import boolean, choice, integer, listed, model_name, number
from pipeline.planning.grid_yaml import read_grid_yaml
from pipeline.planning.model_ids import check_model_id, check_pair_here
from pipeline.planning.plugins import load_drafting_methods, parse_datasets, plugin_kind
from pipeline.planning.problems import Problems
from pipeline.planning.verify_entries import make_verify
from pipeline.registry import parse_entry

MODES = ("live", "replay", "auto")
FIELDS = {"name", "datasets", "turns", "pairs", "methods", "policies", *AXES, "max_new_tokens", "limit",
          "captioner", "shard_size", "mode", "live_samples", "live_seed", "sources", "calibrate",
          "timed_repeats", "calibrate_rounds", "calibrate_repeats", "drafting_methods", "max_image_pixels",
          "max_configurations", "prompt_format"}


def load_grid(path: str | Path, catalog: Catalog | None = None, run_plugins: bool = True) -> GridSpec:
    """Read and validate a grid file; `catalog` defaults to the data registry. Relative data
    paths in it (datasets, sources) are read from the grid file's folder. `run_plugins=False`
    (`--dry-run`, `--list`): the grid's import paths are read, not imported (`plugins`)."""
    path = Path(path)
    raw = read_grid_yaml(path)
    raw = raw if isinstance(raw, dict) else {}
    raw.setdefault("name", path.stem)
    return parse_grid(raw, catalog, base=path.resolve().parent, run_plugins=run_plugins)


def parse_grid(raw: dict[str, Any], catalog: Catalog | None = None, base: Path | None = None,
               run_plugins: bool = True) -> GridSpec:
    """Validate a grid given as a mapping (the parsed YAML) and build the `GridSpec`; every
    problem found is reported, each with the name probably meant. `base`: the folder relative
    data paths are read from (the grid file's; default the working directory)."""
    if not isinstance(raw, dict):
        raise GridError("a grid must be a mapping of field: value")
    base = base or Path.cwd()
    problems = Problems()
    for field in sorted(set(raw) - FIELDS, key=str):
        problems.found.append(f"unknown grid field(s) [{field!r}]{did_you_mean(field, FIELDS)}; "
                              f"known: {sorted(FIELDS)}")
    for required in ("datasets", "pairs", "methods"):
        if required not in raw:
            problems.found.append(f"grid field {required!r} is required")
    if problems.found and any(required not in raw for required in ("datasets", "pairs", "methods")):
        problems.raise_all()
    catalog = catalog or Catalog.from_registry()
    drafting_methods = (problems.check(load_drafting_methods, raw["drafting_methods"], run_plugins,
                                       default=()) if "drafting_methods" in raw else ())
    methods = tuple(problems.each(problems.check(listed, raw["methods"], "methods", default=[]), _method))
    datasets, user_datasets = problems.check(parse_datasets, raw["datasets"], catalog, base, default=((), ()))
    pairs = problems.each(problems.check(listed, raw["pairs"], "pairs", default=[]), _pair)
    verify = problems.check(_axis, raw, "verify", lambda v, where: _verify(v, where, run_plugins), default=())
    fields = dict(
        name=problems.check(check_name, raw.get("name", "grid")),
        datasets=datasets,
        user_datasets=user_datasets,
        drafting_methods=drafting_methods,
        turns=problems.check(_turns, raw.get("turns", [FIRST_TURN]), catalog),
        pairs=tuple(pair for pair, *_ in pairs),
        text_only=tuple(pair for pair, text_only, *_ in pairs if text_only),
        untimed=tuple(pair for pair, _, timed, _ in pairs if not timed),
        timed_only=tuple(pair for pair, _, timed, _ in pairs if timed == "only"),
        spread=problems.check(_spread, pairs, default=()),
        methods=methods,
        policies=tuple(problems.each(problems.check(listed, raw.get("policies", ["static"]), "policies",
                                                    default=[]),
                                     lambda entry, i: _policy(entry, i, methods, run_plugins))),
        window=problems.check(_axis, raw, "window", _window),
        distance=problems.check(_axis, raw, "distance", lambda d, where: choice(d, DISTANCES, where)),
        gamma=problems.check(_axis, raw, "gamma",
                             lambda g, where: integer(g, where, minimum=1, maximum=MAX_GAMMA)),
        temperature=problems.check(_axis, raw, "temperature",
                                   lambda t, where: number(t, where, maximum=MAX_TEMPERATURE)),
        seed=problems.check(_axis, raw, "seed",
                            lambda s, where: integer(s, where, minimum=0, maximum=MAX_SEED)),
        engine=problems.check(_axis, raw, "engine", _engine),
        batch=problems.check(_axis, raw, "batch",
                             lambda b, where: integer(b, where, minimum=1, maximum=MAX_BATCH)),
        verify=tuple(spec for spec, _, _ in verify),
        untimed_verify=tuple(spec for spec, timed, _ in verify if not timed),
        verify_methods=tuple((spec, only) for spec, _, only in verify if only is not None),
        max_new_tokens=problems.check(integer, raw.get("max_new_tokens", GridSpec.max_new_tokens),
                                      "max_new_tokens", minimum=1, maximum=MAX_NEW_TOKENS),
        limit=None if raw.get("limit") is None else problems.check(integer, raw["limit"], "limit", minimum=1,
                                                                   maximum=MAX_SAMPLES),
        captioner=problems.check(model_name, raw.get("captioner"), "captioner"),
        shard_size=problems.check(integer, raw.get("shard_size", GridSpec.shard_size), "shard_size",
                                  minimum=1, maximum=MAX_SAMPLES),
        mode=problems.check(choice, raw.get("mode", GridSpec.mode), MODES, "mode"),
        prompt_format=problems.check(choice, raw.get("prompt_format", GridSpec.prompt_format), PROMPT_FORMATS,
                                     "prompt_format"),
        live_samples=problems.check(integer, raw.get("live_samples", GridSpec.live_samples),
                                    "live_samples", minimum=0, maximum=MAX_SAMPLES),
        live_seed=problems.check(integer, raw.get("live_seed", GridSpec.live_seed), "live_seed", minimum=0,
                                 maximum=MAX_SEED),
        sources=problems.check(_sources, raw.get("sources") or {}, base),
        timed_repeats=problems.check(integer, raw.get("timed_repeats", GridSpec.timed_repeats),
                                     "timed_repeats", minimum=1, maximum=MAX_REPEATS),
        calibrate=problems.check(boolean, raw.get("calibrate", GridSpec.calibrate), "calibrate"),
        calibrate_rounds=problems.check(integer, raw.get("calibrate_rounds", GridSpec.calibrate_rounds),
                                        "calibrate_rounds", minimum=1, maximum=MAX_REPEATS),
        calibrate_repeats=problems.check(integer, raw.get("calibrate_repeats", GridSpec.calibrate_repeats),
                                         "calibrate_repeats", minimum=1, maximum=MAX_REPEATS),
        max_image_pixels=None if raw.get("max_image_pixels") is None else problems.check(
            integer, raw["max_image_pixels"], "max_image_pixels", minimum=1, maximum=MAX_IMAGE_PIXELS),
    )
    bound = problems.check(integer, raw.get("max_configurations", MAX_CONFIGURATIONS), "max_configurations",
                           minimum=1, maximum=10**9)
    problems.raise_all()
    check_size(fields, bound)
    spec = GridSpec(**fields)
    check_combinations(spec, catalog)
    return spec


def _sources(value: Any, base: Path) -> tuple[tuple[str, str], ...]:
    """`sources: {docvqa: /data/docvqa, nq: copies/nq.parquet}`; every path must exist here
    (a relative one in `base`, the grid file's folder)."""
    if not isinstance(value, dict):
        raise GridError("grid field 'sources' must map dataset or task names to local paths")
    problems, found = Problems(), []
    for name, path in value.items():
        if not isinstance(path, str):
            problems.found.append(f"sources.{name}: expected a local path, got {path!r}")
            continue
        try:
            found.append((str(name), str(local_path(path, base))))
        except FileNotFoundError as err:
            problems.found.append(f"sources.{name}: local copy {path!r} does not exist ({err})")
    problems.raise_all()
    return tuple(sorted(found))


def _turns(value: Any, catalog: Catalog) -> tuple[str, ...]:
    def turn(name: Any, i: int) -> str:
        if name != FIRST_TURN and name not in catalog.turn_tasks:
            raise GridError(f"turns[{i}]: unknown turn {name!r}"
                            f"{did_you_mean(name, [FIRST_TURN, *catalog.turn_tasks])}; "
                            f"use {FIRST_TURN!r} or a later-turn task of {sorted(catalog.turn_tasks)}")
        return name

    problems = Problems()
    turns = problems.each(listed(value, "turns"), turn)
    problems.raise_all()
    return tuple(turns)


PAIR_KEYS = ("target", "draft", "dtype", "text_only", "timed", "gpus")


def _pair(entry: Any, i: int) -> tuple[Pair, bool, bool | str, int | None]:
    """A pair, whether its models may be plain causal LMs (`text_only: true`), whether it
    is timed on the grid's `live_samples` (`timed: false` replays it there too; `timed: only`
    decodes those samples alone: a head, whose rows all run live), and the GPUs its actor
    holds (`gpus: 2`: a target too large for one, spread over two; None: the run's)."""
    where = f"pairs[{i}]"
    if not isinstance(entry, dict):
        raise GridError(f"{where}: expected a mapping {{target, draft, dtype}}, got {entry!r}")
    unknown = sorted(set(entry) - set(PAIR_KEYS))
    if unknown:
        raise GridError(f"{where}: unknown key(s) {unknown}{did_you_mean(unknown[0], PAIR_KEYS)}; "
                        f"known: {', '.join(PAIR_KEYS)}")
    for key in ("target", "draft"):
        if key not in entry:
            raise GridError(f"{where}: missing {key!r}")
    pair = Pair(
        target=check_model_id(entry["target"], f"{where}.target"),
        draft=check_model_id(entry["draft"], f"{where}.draft"),
        dtype=choice(entry.get("dtype", "fp32"), tuple(DTYPES), f"{where}.dtype"),
    )
    text_only = boolean(entry.get("text_only", False), f"{where}.text_only")
    timed, gpus = entry.get("timed", True), entry.get("gpus")
    timed = timed if timed == "only" else boolean(timed, f"{where}.timed (or only)")
    gpus = None if gpus is None else integer(gpus, f"{where}.gpus", minimum=1, maximum=MAX_GPUS_PER_WORKER)
    check_pair_here(pair, where, allow_text=text_only)
    return pair, text_only, timed, gpus


def _spread(pairs: list[tuple[Pair, bool, bool | str, int | None]]) -> tuple[tuple[str, str, int], ...]:
    """(target, dtype, GPUs) of each target given `gpus:`; one actor loads a target with all its
    drafts, so its pairs must agree."""
    given: dict[tuple[str, str], int] = {}
    for i, (pair, _, _, gpus) in enumerate(pairs):
        if gpus is None:
            continue
        key = (pair.target, pair.dtype)
        if given.setdefault(key, gpus) != gpus:
            raise GridError(f"pairs[{i}].gpus: {gpus}, but an earlier pair of target {pair.target} "
                            f"({pair.dtype}) gave {given[key]}; one actor loads a target with all its drafts")
    return tuple((target, dtype, gpus) for (target, dtype), gpus in given.items())


def _method(value: Any, i: int) -> str:
    """A method set (`MT`: letters of the registered drafting methods) or `AR`."""
    methods = str(value)
    if methods == AR:
        return methods
    try:
        DecodeConfig(methods=methods).validate()
    except ValueError as err:
        letters = "".join(dict.fromkeys(m for m in methods.upper() if m in METHODS))
        hint = did_you_mean(methods, [AR, letters] if letters else [AR])
        raise GridError(f"methods[{i}] {methods!r}: {err} "
                        f"(or {AR!r} for the autoregressive baseline){hint}") from err
    return methods


GRID_AXES_OF_POLICIES = ("window", "distance")  # set once for every policy, as grid axes


def _policy(entry: Any, i: int, method_sets: tuple[str, ...], run_plugins: bool) -> PolicyEntry:
    """`kind` names the policy; `methods` restricts it to some ensembles; every other key is
    one of that policy's own fields (pipeline.drafting.policies)."""
    where = f"policies[{i}]"
    try:
        kind, entry = parse_entry(entry, POLICIES)
    except ValueError as err:
        raise GridError(f"{where}: {err}") from None
    kind, methods = plugin_kind(kind, WeightPolicy, f"{where}.kind", run_plugins), entry.pop("methods", None)
    if methods is not None:
        methods = tuple(str(m) for m in listed(methods, f"{where}.methods"))
        for m in methods:
            if m not in method_sets or len(m) < 2 or m == AR:
                raise GridError(f"{where}.methods: {m!r} is not an ensemble of this grid's methods "
                                f"{list(method_sets)}")
    try:
        note = f" ({' and '.join(GRID_AXES_OF_POLICIES)} are grid axes)"
        return PolicyEntry(POLICIES.make(kind, entry, hidden=GRID_AXES_OF_POLICIES, note=note), methods)
    except ValueError as err:
        raise GridError(f"{where}: {err}") from err


def _axis(raw: dict[str, Any], name: str, parse: Callable[[Any, str], Any]) -> tuple:
    """An axis written as a scalar or a list (default: the grid's), each entry parsed with its
    place, e.g. `gamma[1]`, for the error; every bad entry is reported."""
    problems = Problems()
    values = problems.each(listed(raw.get(name, list(getattr(GridSpec, name))), name),
                           lambda value, i: parse(value, f"{name}[{i}]"))
    problems.raise_all()
    return tuple(values)


def _window(value: Any, where: str) -> int | None:
    if value is None or (isinstance(value, str) and value.upper() == "ALL"):
        return None
    return integer(value, where, minimum=1, maximum=MAX_NEW_TOKENS)


def _verify(value: Any, where: str, run_plugins: bool) -> tuple[VerifySpec, bool, tuple[str, ...] | None]:
    """A verify entry (its kind may be an import path), whether it runs live on `live_samples`
    (`timed: false` replays it there too) and its `methods:` (None: all; grid_checks checks them)."""
    if isinstance(value, VerifySpec):  # the axis's default
        return value, True, None
    entry = dict(value) if isinstance(value, dict) else {"kind": value}
    timed = boolean(entry.pop("timed", True), f"{where}.timed")
    only = entry.pop("methods", None)
    only = None if only is None else tuple(str(m) for m in listed(only, f"{where}.methods"))
    if "kind" in entry:
        entry["kind"] = plugin_kind(entry["kind"], VerifySpec, f"{where}.kind", run_plugins)
    try:
        return make_verify(entry), timed, only
    except ValueError as err:
        raise GridError(f"{where}: {err}") from err


def _engine(value: Any, where: str) -> str:
    if value not in ENGINE_CHOICES:
        raise GridError(f"{where}: unknown engine {value!r}; choose one of {', '.join(ENGINE_CHOICES)}"
                        f"{did_you_mean(value, ENGINE_CHOICES)}")
    return value

