"""What a grid run has to compute, in shards: which configurations replay and which run
live, cut into shards of a few samples, and the `--dry-run` summary. No Ray here:
`actors.runner` dispatches the shards.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable, Sequence

from pipeline.data.sample import Sample
from pipeline.planning.grid import FIRST_TURN, GridSpec, Pair, RunConfig, Shard, WorkUnit, row_key


def decode_mode(config: RunConfig, grid_mode: str) -> str:
    """`replay` for greedy configurations unless the grid forces live runs; sampling is always
    live. Greedy AR rides along with replay: trace collection decodes y with the plain AR loop,
    and that decode (timings included) is the AR row."""
    if not config.greedy or grid_mode == "live":
        return "live"
    return "replay"


def plan_shards(
    run: str,
    units: Sequence[WorkUnit],
    samples_for: Callable[[WorkUnit], list[Sample]],
    *,
    shard_size: int,
    grid_mode: str = "live",
    live_samples: int = 0,
    done: set[str] = frozenset(),
) -> list[Shard]:
    """Shards of at most `shard_size` samples, one pair, dataset and turn each, without the
    rows in `done`. Replay shards carry every greedy configuration of their samples (one
    trace collection scores them all); live shards carry one configuration. In `auto` mode the
    greedy SD configs of `live_samples` first-turn samples per model pair, taken round-robin
    over its datasets, run live instead, so walltime is measured on them
    (replay and live give the same accepted counts, so each row is computed once either way)."""
    groups: dict[tuple[Pair, str, str], list[RunConfig]] = defaultdict(list)
    for unit in units:
        groups[(unit.config.pair, unit.dataset, unit.turn)].append(unit.config)
    first_turn_datasets: dict[Pair, list[str]] = defaultdict(list)
    for pair, dataset, turn in groups:
        if turn == FIRST_TURN:
            first_turn_datasets[pair].append(dataset)
    shards = []
    for (pair, dataset, turn), configs in groups.items():
        hashes = {s.sample_id: s.prompt_hash for s in samples_for(WorkUnit(configs[0], dataset, turn))}
        sample_ids = list(hashes)
        timed_first_turn = grid_mode == "auto" and turn == FIRST_TURN
        live_here = timed_per_dataset(live_samples, first_turn_datasets[pair], dataset) if timed_first_turn else 0
        timed = set(sample_ids[:live_here])
        for mode, bundle, ids in _bundles(configs, sample_ids, timed, grid_mode):
            for start in range(0, len(ids), shard_size):
                items = tuple(
                    (config, sample_id)
                    for sample_id in ids[start:start + shard_size]
                    for config in bundle
                    if row_key(config.key(), sample_id, hashes[sample_id]) not in done
                    and not (mode == "replay" and sample_id in timed and not config.is_ar)
                )
                if items:
                    prompts = tuple((sid, hashes[sid]) for sid in dict.fromkeys(sid for _, sid in items))
                    shards.append(Shard(run, pair, dataset, turn, mode, items, prompts))
    return shards


def _bundles(
    configs: list[RunConfig], sample_ids: list[str], timed: set[str], grid_mode: str
) -> list[tuple[str, list[RunConfig], list[str]]]:
    """(mode, configurations, sample ids) of one pair, dataset and turn: one replay bundle of
    every replayable configuration, then one live bundle per configuration that runs live on
    all samples, or only on the `timed` ones (SD configurations; AR's replay row is timed)."""
    replayed = [c for c in configs if decode_mode(c, grid_mode) == "replay"]
    bundles = [("replay", replayed, sample_ids)]
    for config in configs:
        if decode_mode(config, grid_mode) == "live":
            bundles.append(("live", [config], sample_ids))
        elif timed and not config.is_ar:
            bundles.append(("live", [config], [s for s in sample_ids if s in timed]))
    return bundles


def timed_per_dataset(live_samples: int, datasets: Sequence[str], dataset: str) -> int:
    """How many of `dataset`'s first samples run live when a pair's `live_samples` are dealt
    round-robin over its `datasets` (walltime speedup is reported per pair, not per dataset)."""
    index = datasets.index(dataset)
    return max(0, -(-(live_samples - index) // len(datasets)))


def unit_counts(spec: GridSpec) -> Iterable[str]:
    """Lines for `--dry-run`: work units per dataset, turn, model pair and method set."""
    yield f"grid {spec.name}: {len(spec.configs())} configurations, {len(spec.units())} work units"
    for axis, counter in spec.counts().items():
        yield f"  by {axis}:"
        for name, n in counter.items():
            yield f"    {name}: {n}"
    samples = f"{spec.limit} samples each" if spec.limit else "all samples of each dataset"
    yield f"  ({samples}, shards of {spec.shard_size})"
