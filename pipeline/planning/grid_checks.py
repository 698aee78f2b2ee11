"""Checks of a grid as a whole: what no single field can rule out (a value listed twice, a
method set no policy runs on, caption drafting without a captioner, a second turn without
greedy first turns, a follow-up turn on a dataset without its own, a dataset read only from a
local copy that `sources` does not name, ...). Run by `pipeline.planning.grid_file` before
anything loads.
"""
from __future__ import annotations

from typing import Iterator

from pipeline.models.head_names import head_kind
from pipeline.models.lookup_names import model_of, observes, plans
from pipeline.data.sample import FOLLOWUP_TURNS, previous_turn
from pipeline.drafting.methods import METHODS, needs_captions
from pipeline.names import did_you_mean
from pipeline.planning.catalog import Catalog
from pipeline.planning.grid import AR, FIRST_TURN, GridError, GridSpec, Pair
from pipeline.planning.model_ids import model_kind
from pipeline.planning.problems import GridProblems

QUESTION_TASKS = ("nq", "gsm8k")  # second-turn tasks that read a question dataset
AXES = ("window", "distance", "gamma", "temperature", "seed", "engine", "verify", "batch")
LISTED_FIELDS = ("datasets", "turns", "pairs", "methods", "policies", *AXES)


def _repeats(spec: GridSpec) -> Iterator[str]:
    """A value listed twice would silently run once: say so instead."""
    for name in LISTED_FIELDS:
        values = getattr(spec, name)
        for j, value in enumerate(values):
            if value in values[:j]:
                shown = value.label if isinstance(value, Pair) else value
                yield f"{name}[{j}]: {shown!r} is already listed as {name}[{values.index(value)}]"


def check_combinations(spec: GridSpec, catalog: Catalog) -> None:
    """Combinations no single field can rule out; every one found is reported."""
    problems = list(_repeats(spec)) + list(_data(spec, catalog)) + list(_combinations(spec))
    if problems:
        raise GridError(problems[0]) if len(problems) == 1 else GridProblems(problems)


def _data(spec: GridSpec, catalog: Catalog) -> Iterator[str]:
    """What the datasets need: their `sources` entries, and questions of their own for follow-ups."""
    named = dict(spec.sources)
    copies = {catalog.source_key(dataset) for dataset in spec.datasets}
    for name in named:
        if name in catalog.needs_source and catalog.source_key(name) != name:
            yield f"sources.{name}: {name!r} reads the copy named sources.{catalog.source_key(name)}"
        elif name not in copies and not (name in QUESTION_TASKS and name in spec.turns):
            yield f"sources.{name}: not a dataset or question task ({', '.join(QUESTION_TASKS)}) of this grid"
    missing: dict[str, list[str]] = {}
    for dataset in spec.datasets:
        if dataset in catalog.needs_source and catalog.source_key(dataset) not in named:
            missing.setdefault(catalog.source_key(dataset), []).append(dataset)
    for entry, names in missing.items():
        yield (f"datasets {names} are on no hub this pipeline can load: add their local copy to the grid, "
               f"sources: {{{entry}: /path/to/copy}}")
    followups = [turn for turn in spec.turns if turn in FOLLOWUP_TURNS]
    for i, dataset in enumerate(spec.datasets if followups else ()):
        if dataset not in catalog.followup_datasets:
            yield (f"datasets[{i}] {dataset!r} has no follow-up questions of its own for turns {followups} "
                   f"(datasets with them: {', '.join(catalog.followup_datasets) or 'none'})")
    for turn in followups:
        if previous_turn(turn) not in spec.turns:
            yield f"turns: {turn!r} continues the {previous_turn(turn)!r} turn; add it to turns"


def _combinations(spec: GridSpec) -> Iterator[str]:
    if spec.live_samples and spec.mode != "auto":
        yield f"live_samples: {spec.live_samples} only applies to mode 'auto' (mode is {spec.mode!r})"
    if spec.timed_only and not (spec.live_samples and spec.mode == "auto"):
        named = ", ".join(p.label for p in spec.timed_only)
        yield (f"pairs {named}: 'timed: only' decodes the timed samples alone, so it needs mode 'auto' "
               "and live_samples above 0")
    for i, methods in enumerate(spec.methods):
        if not any(policy.applies_to(methods) for policy in spec.policies):
            yield (f"methods[{i}] {methods!r}: no policy runs on it "
                   "(every policy's 'methods' names other ensembles)")
        captioned = "" if methods == AR else "".join(m for m in methods if needs_captions(m))
        if captioned and spec.captioner is None:
            yield (f"methods[{i}] {methods!r} uses caption drafting ({captioned}) "
                   "but the grid sets no captioner")
        for letter in "" if methods == AR else methods:
            for j, pair in enumerate(spec.pairs):
                if model_kind(pair.draft) in METHODS[letter].refused_draft_kinds:
                    yield (f"methods[{i}] {methods!r} with pairs[{j}].draft {pair.draft!r}: "
                           f"{METHODS[letter].name} drafting ({letter}) cannot run on a "
                           f"{model_kind(pair.draft)} draft")
    if spec.second_turns:
        if FIRST_TURN not in spec.turns:
            yield (f"turns {list(spec.second_turns)} build on the target's first-turn answers: "
                   f"add {FIRST_TURN!r} to turns")
        if 0.0 not in spec.temperature:
            yield (f"turns {list(spec.second_turns)} need the target's greedy first-turn answers: "
                   "add 0 to temperature")
    if spec.mode == "replay" and any(t > 0 for t in spec.temperature):
        yield "mode 'replay' scores greedy configurations only; use 'auto' to run temperature > 0 live"
    restricted = dict(spec.verify_methods)
    for i, verify in enumerate(spec.verify):
        for methods in restricted.get(verify, ()):
            if methods not in spec.methods or methods == AR:
                yield (f"verify[{i}].methods: {methods!r} is not a method set of this grid's methods "
                       f"{[m for m in spec.methods if m != AR]}{did_you_mean(methods, spec.methods)}")
    heads = [pair.draft for pair in spec.pairs if head_kind(model_of(pair.draft)) is not None]
    if spec.mode == "replay" and heads:
        yield (f"mode 'replay' cannot score head drafts ({', '.join(heads)}): a head drafts from its own "
               "guesses past a block's first token, which a teacher-forced pass never makes; use 'auto'")
    observing = [pair.draft for pair in spec.pairs if observes(pair.draft)]
    if spec.mode == "replay" and observing:
        yield (f"mode 'replay' cannot score {', '.join(observing)}: its lookup learns from what the target "
               "verified in each block, which a teacher-forced pass never makes; use 'auto'")
    lookups = [pair.draft for pair in spec.pairs if plans(pair.draft)]
    trees = sorted({v.label for v in spec.verify if not v.is_chain and v.settled(1, 1)[0].kind != "chain"})
    if spec.mode == "replay" and lookups and trees:
        yield (f"mode 'replay' scores lookup drafts ({', '.join(lookups)}) as chains only, not as "
               f"{', '.join(trees)} (a lookup follows its own plan down a tree); use 'auto'")
    for kind in sorted({v.kind for v in spec.verify if not v.replayable} if spec.mode == "replay" else ()):
        yield (f"mode 'replay' cannot score {kind} trees (their shape needs the draft off the target's "
               "path); use 'auto' to run them live")
    for config in spec.configs():
        if not config.decode.is_ar:
            try:
                config.decode.validate()
            except ValueError as err:
                yield (f"configuration {config.decode.methods} / {config.decode.policy.label} "
                       f"on {config.pair.label}: {err}")
