"""What a grid run has to compute, in shards: which configurations replay and which run
live, cut into shards of a few samples, and the `--dry-run` summary. No Ray here:
`actors.runner` dispatches the shards.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Callable, Collection, Iterable, Sequence

from pipeline.data.sample import Sample
from pipeline.decoding.verify_kinds import VerifySpec
from pipeline.planning.grid import (
    FIRST_TURN, GridSpec, ModelGroup, Pair, RunConfig, Shard, WorkUnit, model_groups, row_key,
)


def decode_mode(config: RunConfig, grid_mode: str) -> str:
    """`replay` for greedy configurations unless the grid forces live runs; sampling, trees
    whose shape depends on the draft off the target's path (dynamic) and head drafts are always
    live (`RunConfig.replayable`). Greedy AR rides along with replay: trace collection decodes y
    with the plain AR loop, and that decode (timings included) is the AR row."""
    if config.decode.is_ar:
        return "live" if grid_mode == "live" or config.batch > 1 or not config.decode.greedy else "replay"
    if not config.replayable or grid_mode == "live" or config.batch > 1:
        return "live"
    return "replay"


def plan_shards(
    run: str,
    units: Sequence[WorkUnit],
    samples_for: Callable[[WorkUnit], list[Sample]],
    *,
    shard_size: int,
    grid_mode: str = "live",
    timed: Collection[str] = frozenset(),
    untimed: frozenset[Pair | VerifySpec] = frozenset(),
    timed_only: frozenset[Pair] = frozenset(),
    done: set[str] = frozenset(),
) -> list[Shard]:
    """Shards of at most `shard_size` samples, one model group (a target and its drafts),
    dataset and turn each, without the rows in `done`. Replay shards carry every greedy
    configuration of their samples, for every draft (one trace collection scores them all);
    live shards carry the greedy configurations together (one shadow replay checks them,
    `actors.target_worker`) or one sampling configuration. In `auto` mode every greedy
    configuration of the `timed` first-turn samples (the run's walltime samples, chosen once:
    `pipeline.planning.samples.RunSamples.timed_ids`) runs live instead, AR included, so
    walltime is measured on them, except for the `untimed` pairs and verify kinds, which are replayed there
    too; the `timed_only` pairs decode the timed samples alone. Each row is computed once either
    way, and every live shard names its timed samples."""
    group_of = model_groups(unit.config.pair for unit in units)
    groups: dict[tuple[ModelGroup, str, str], list[RunConfig]] = defaultdict(list)
    for unit in units:
        groups[(group_of[unit.config.pair], unit.dataset, unit.turn)].append(unit.config)
    timed = set(timed) if grid_mode == "auto" else set()
    shards = []
    for (group, dataset, turn), configs in groups.items():
        here = _samples(configs, dataset, turn, samples_for, timed_only)
        hashes = {s.sample_id: s.prompt_hash for s in here}
        timed_here = timed & set(hashes) if turn == FIRST_TURN else set()
        for mode, bundle, ids in _bundles(configs, list(hashes), timed_here, grid_mode, untimed):
            batch = bundle[0].batch
            size = -(-shard_size // batch) * batch  # whole batches in a shard
            for start in range(0, len(ids), size):
                items = tuple(
                    (config, sample_id)
                    for sample_id in ids[start:start + size]
                    for config in bundle
                    if row_key(config.key(), sample_id, hashes[sample_id]) not in done
                    and not (mode == "replay" and sample_id in timed_here and is_timed(config, untimed))
                    and (config.pair not in timed_only or sample_id in timed_here)
                )
                if items:
                    prompts = tuple((sid, hashes[sid]) for sid in dict.fromkeys(sid for _, sid in items))
                    shard_timed = tuple(sid for sid, _ in prompts if sid in timed_here and mode == "live")
                    shards.append(Shard(run, group, dataset, turn, mode, items, prompts, shard_timed))
    return shards


def _samples(configs: list[RunConfig], dataset: str, turn: str,
             samples_for: Callable[[WorkUnit], list[Sample]], timed_only: frozenset[Pair]) -> list[Sample]:
    """The samples of a group's dataset and turn: those of a pair that decodes them all, if any
    (a `timed_only` pair decodes the timed ones alone)."""
    config = min(configs, key=lambda c: c.pair in timed_only)
    return samples_for(WorkUnit(config, dataset, turn))


def is_timed(config: RunConfig, untimed: frozenset[Pair | VerifySpec]) -> bool:
    """Whether a replayable configuration runs live on the timed samples: neither its pair nor
    its verify kind is marked `timed: false`."""
    return config.pair not in untimed and config.decode.verify not in untimed


def _bundles(
    configs: list[RunConfig], sample_ids: list[str], timed: set[str], grid_mode: str,
    untimed: frozenset[Pair | VerifySpec],
) -> list[tuple[str, list[RunConfig], list[str]]]:
    """(mode, configurations, sample ids) of one group, dataset and turn: one replay bundle of
    every replayable configuration; one live bundle of the greedy configurations that run live
    (all of them in `live` mode, the replayable ones of timed pairs on the `timed` samples in
    `auto` mode); one live bundle per sampling configuration decoded alone; one live bundle per
    batch size above 1, every configuration of that size in it, sampled or greedy."""
    replayed = [c for c in configs if decode_mode(c, grid_mode) == "replay"]
    live_greedy = [c for c in configs
                   if c.decode.greedy and c.batch == 1 and decode_mode(c, grid_mode) == "live"]
    bundles = [("replay", replayed, sample_ids), ("live", live_greedy, sample_ids)]
    # a batch size's configurations decode together, its AR baseline included (its walltime is theirs)
    bundles += [("live", [c for c in configs if c.batch == batch], sample_ids)
                for batch in sorted({c.batch for c in configs} - {1})]
    if timed:
        bundles.append(("live", [c for c in replayed if is_timed(c, untimed)],
                        [s for s in sample_ids if s in timed]))
    bundles += [("live", [c], sample_ids) for c in configs if not c.decode.greedy and c.batch == 1]
    return [bundle for bundle in bundles if bundle[1]]


def counts(spec: GridSpec) -> dict[str, Counter]:
    """Work-unit counts per dataset, turn, model pair, method set, policy, engine and verify kind."""
    units = spec.units()
    gpus = {(target, dtype): f", {n} GPUs per worker" for target, dtype, n in spec.spread}
    pair = lambda p: p.label + gpus.get((p.target, p.dtype), "")
    return {
        "dataset": Counter(u.dataset for u in units),
        "turn": Counter(u.turn for u in units),
        "pair": Counter(pair(u.config.pair) for u in units),
        "method set": Counter(u.config.decode.methods for u in units),
        "policy": Counter(u.config.decode.policy.label for u in units),
        "engine": Counter(u.config.engine for u in units),
        "verify": Counter(u.config.decode.verify.label for u in units),
    }


def unit_counts(spec: GridSpec) -> Iterable[str]:
    """Lines for `--dry-run`: work units per dataset, turn, model pair and method set."""
    yield f"grid {spec.name}: {len(spec.configs())} configurations, {len(spec.units())} work units"
    for axis, counter in counts(spec).items():
        yield f"  by {axis}:"
        for name, n in counter.items():
            yield f"    {name}: {n}"
    samples = f"{spec.limit} samples each" if spec.limit else "all samples of each dataset"
    yield f"  ({samples}, shards of {spec.shard_size})"
