"""Runs a validated grid on Ray: plan shards, keep one actor per model pair busy, write each
finished shard at once, survive dead actors, resume from what is already written.

First turns run first; second turns are built from the target's greedy first-turn answers
as read back from the results dataset (docs/algorithm.md §4), then run on the same actors.
"""
from __future__ import annotations

import math
import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence, TextIO

from pipeline.data.sample import Sample
from pipeline.grid import FIRST_TURN, GridSpec, Pair, RunConfig, Shard, WorkUnit, row_key
from pipeline.results import done_keys, first_turn_answers, write_shard

IN_FLIGHT_PER_WORKER = 2  # one running, one queued behind it, so a worker never waits on the driver


class SampleSource(Protocol):
    """Where samples come from (the data registry by default; tests inject their own)."""

    def first_turn(self, dataset: str, limit: int | None) -> list[Sample]: ...

    def second_turn(self, first_samples: list[Sample], first_outputs: dict[str, str], task: str) -> list[Sample]: ...


class RegistrySource:
    """Samples from `pipeline.data.registry`, loaded once per dataset, from the local copies
    in `sources` (dataset or question-task name -> path) where given, else the hub."""

    def __init__(self, sources: dict[str, str] | None = None) -> None:
        self.sources = sources or {}
        self._cache: dict[tuple[str, int | None], list[Sample]] = {}

    def first_turn(self, dataset: str, limit: int | None) -> list[Sample]:
        from pipeline.data import load_samples

        if (dataset, limit) not in self._cache:
            self._cache[(dataset, limit)] = load_samples(dataset, limit=limit, source=self.sources.get(dataset))
        return self._cache[(dataset, limit)]

    def second_turn(self, first_samples: list[Sample], first_outputs: dict[str, str], task: str) -> list[Sample]:
        from pipeline.data import build_second_turn

        return build_second_turn(first_samples, first_outputs, task, source=self.sources.get(task))


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
        sample_ids = [s.sample_id for s in samples_for(WorkUnit(configs[0], dataset, turn))]
        timed_first_turn = grid_mode == "auto" and turn == FIRST_TURN
        live_here = timed_per_dataset(live_samples, first_turn_datasets[pair], dataset) if timed_first_turn else 0
        timed = set(sample_ids[:live_here])
        replayed = [c for c in configs if decode_mode(c, grid_mode) == "replay"]
        # (mode, configs, sample ids): one replay bundle, then one live bundle per configuration
        bundles = [("replay", replayed, sample_ids)] + [
            ("live", [c], sample_ids if decode_mode(c, grid_mode) == "live" else [s for s in sample_ids if s in timed])
            for c in configs
            if decode_mode(c, grid_mode) == "live" or (timed and not c.is_ar)
        ]
        for mode, bundle, ids in bundles:
            for start in range(0, len(ids), shard_size):
                items = tuple(
                    (config, sample_id)
                    for sample_id in ids[start:start + shard_size]
                    for config in bundle
                    if row_key(config.key(), sample_id) not in done
                    and not (mode == "replay" and sample_id in timed and not config.is_ar)
                )
                if items:
                    shards.append(Shard(run, pair, dataset, turn, mode, items))
    return shards


def timed_per_dataset(live_samples: int, datasets: Sequence[str], dataset: str) -> int:
    """How many of `dataset`'s first samples run live when a pair's `live_samples` are dealt
    round-robin over its `datasets` (walltime speedup is reported per pair, not per dataset)."""
    index = datasets.index(dataset)
    return max(0, -(-(live_samples - index) // len(datasets)))


class Progress:
    """One console line per finished shard: done/total shards, samples/s, ETA. A sample here
    is one row: a sample decoded (or replayed) under one configuration."""

    def __init__(self, label: str, total: int, stream: TextIO = sys.stdout) -> None:
        self.label, self.total, self.stream = label, total, stream
        self.done = self.rows = 0
        self.start = time.monotonic()

    def advance(self, rows: int) -> None:
        self.done += 1
        self.rows += rows
        elapsed = max(time.monotonic() - self.start, 1e-9)
        eta = elapsed / self.done * (self.total - self.done)
        print(
            f"[{self.label}] {self.done}/{self.total} shards, {self.rows} samples, "
            f"{self.rows / elapsed:.2f} samples/s, ETA {_clock(eta)}",
            file=self.stream, flush=True,
        )


def _clock(seconds: float) -> str:
    seconds = int(math.ceil(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class RunReport:
    shards_planned: int = 0  # shards with rows still to compute when planned
    shards_written: int = 0
    rows_written: int = 0
    rows_skipped: int = 0  # already present from an earlier run
    redispatched: int = 0
    seconds: float = 0.0


@dataclass
class _Worker:
    pair: Pair
    handle: object
    in_flight: dict = field(default_factory=dict)  # ObjectRef -> Shard


class GridRunner:
    """Drives one run of a grid. `on_shard_written(path, runner)` is called after every write
    (tests use it to kill an actor or interrupt the driver mid-run)."""

    def __init__(
        self,
        spec: GridSpec,
        out: str | Path,
        *,
        source: SampleSource | None = None,
        run: str | None = None,
        workers: int | None = None,
        gpus_per_worker: float | None = None,
        cpus_per_worker: float = 1,
        max_attempts: int = 3,
        on_shard_written: Callable[[Path, "GridRunner"], None] | None = None,
        stream: TextIO = sys.stdout,
    ) -> None:
        self.spec, self.out = spec, Path(out)
        self.source = source or RegistrySource(dict(spec.sources))
        self.run_name = run or spec.name
        self.requested_workers, self.gpus_per_worker, self.cpus_per_worker = workers, gpus_per_worker, cpus_per_worker
        self.max_attempts = max_attempts
        self.on_shard_written = on_shard_written
        self.stream = stream
        self.workers: list[_Worker] = []
        self.report = RunReport()
        self._attempts: dict[str, int] = defaultdict(int)
        self._samples: dict[str, Sample] = {}
        self._second_turn: dict[tuple, list[Sample]] = {}

    # -- samples -------------------------------------------------------------------------

    def samples_for(self, unit: WorkUnit) -> list[Sample]:
        if unit.turn == FIRST_TURN:
            samples = self.source.first_turn(unit.dataset, self.spec.limit)
        else:
            pair, config = unit.config.pair, unit.config
            key = (pair.target, pair.dtype, unit.dataset, unit.turn, config.max_new_tokens)
            if key not in self._second_turn:
                answers = first_turn_answers(
                    self.out, self.run_name, target=pair.target, dtype=pair.dtype,
                    dataset=unit.dataset, max_new_tokens=config.max_new_tokens,
                )
                first = self.source.first_turn(unit.dataset, self.spec.limit)
                self._second_turn[key] = self.source.second_turn(first, answers, unit.turn)
            samples = self._second_turn[key]
        for sample in samples:
            self._samples.setdefault(self._sample_key(unit.config.pair, sample.sample_id), sample)
        return samples

    @staticmethod
    def _sample_key(pair: Pair, sample_id: str) -> str:
        # second-turn prompts hold the target's own answer: the same id differs per target
        return f"{pair.target}|{pair.dtype}|{sample_id}"

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> RunReport:
        import ray

        start = time.monotonic()
        try:
            phases = [("first turn", [FIRST_TURN])] if FIRST_TURN in self.spec.turns else []
            if self.spec.second_turns:
                phases.append(("second turn", list(self.spec.second_turns)))
            for label, turns in phases:
                units = self.spec.units(turns)
                done = done_keys(self.out, self.run_name)
                planned = plan_shards(
                    self.run_name, units, self.samples_for, shard_size=self.spec.shard_size,
                    grid_mode=self.spec.mode, live_samples=self.spec.live_samples, done=done,
                )
                self.report.rows_skipped += sum(
                    len(self.samples_for(u)) for u in units
                ) - sum(len(s.items) for s in planned)
                self.report.shards_planned += len(planned)
                print(f"[{label}] {len(planned)} shards to run ({len(units)} work units)", file=self.stream, flush=True)
                if planned:
                    self._dispatch(planned, Progress(label, len(planned), self.stream), ray)
        finally:
            for worker in self.workers:
                ray.kill(worker.handle)
            self.workers.clear()
            self.report.seconds = time.monotonic() - start
        return self.report

    def _worker_count(self, ray) -> tuple[int, float]:
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0.0)
        per_worker = self.gpus_per_worker if self.gpus_per_worker is not None else (1.0 if gpus else 0.0)
        if per_worker > gpus:
            raise RuntimeError(f"workers need {per_worker} GPU each but the Ray cluster has {gpus:g}")
        slots = max(1, int(gpus / per_worker if per_worker else resources.get("CPU", 1.0) / self.cpus_per_worker))
        # more actors than the cluster can place would hold shards that never run
        return min(self.requested_workers or slots, slots), per_worker

    def _dispatch(self, shards: list[Shard], progress: Progress, ray) -> None:
        from actors.pair_worker import remote_worker

        slots, gpus = self._worker_count(ray)
        pending: dict[Pair, deque[Shard]] = defaultdict(deque)
        for shard in shards:
            pending[shard.pair].append(shard)
        captioner = self.spec.captioner if any("C" in m for m in self.spec.methods) else None

        def start_worker(pair: Pair) -> None:
            handle = remote_worker(pair, captioner, num_gpus=gpus, num_cpus=self.cpus_per_worker)
            self.workers.append(_Worker(pair, handle))

        def neediest_pair() -> Pair | None:
            live = defaultdict(int)
            for w in self.workers:
                live[w.pair] += 1
            waiting = [p for p, q in pending.items() if q]
            return max(waiting, key=lambda p: len(pending[p]) / (live[p] + 1), default=None)

        def fill() -> None:
            for worker in self.workers:
                while pending[worker.pair] and len(worker.in_flight) < IN_FLIGHT_PER_WORKER:
                    self._submit(worker, pending[worker.pair].popleft(), ray)
            while True:
                pair = neediest_pair()
                if pair is None:
                    return
                if len(self.workers) >= slots:  # recycle a worker whose pair has nothing left
                    idle = next((w for w in self.workers if not pending[w.pair] and not w.in_flight), None)
                    if idle is None:
                        return
                    ray.kill(idle.handle)
                    self.workers.remove(idle)
                start_worker(pair)
                worker = self.workers[-1]
                while pending[pair] and len(worker.in_flight) < IN_FLIGHT_PER_WORKER:
                    self._submit(worker, pending[pair].popleft(), ray)

        fill()
        while any(w.in_flight for w in self.workers):
            refs = [ref for w in self.workers for ref in w.in_flight]
            ready, _ = ray.wait(refs, num_returns=1)
            ref = ready[0]
            worker = next(w for w in self.workers if ref in w.in_flight)
            shard = worker.in_flight.pop(ref)
            try:
                table = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                if err.actor_init_failed:  # loading the pair failed: deterministic, retrying cannot help
                    raise RuntimeError(f"the worker for {worker.pair.label} could not start: {err}") from err
                self._redispatch(worker, shard, err, pending, ray)
            else:
                path = write_shard(self.out, table)
                self.report.shards_written += 1
                self.report.rows_written += table.num_rows
                progress.advance(table.num_rows)
                if self.on_shard_written:
                    self.on_shard_written(path, self)
            fill()

    def _submit(self, worker: _Worker, shard: Shard, ray) -> None:
        samples = {sid: self._samples[self._sample_key(shard.pair, sid)] for sid in shard.sample_ids}
        worker.in_flight[worker.handle.run_shard.remote(shard, samples)] = shard

    def _redispatch(self, worker: _Worker, shard: Shard, err: Exception, pending: dict, ray) -> None:
        """The actor is gone for good (Ray's restarts used up): replace it, queue its shards again."""
        lost = [shard, *worker.in_flight.values()]
        worker.in_flight.clear()
        if worker in self.workers:
            self.workers.remove(worker)
            ray.kill(worker.handle)
        for item in lost:
            self._attempts[item.shard_id] += 1
            if self._attempts[item.shard_id] >= self.max_attempts:
                raise RuntimeError(
                    f"shard {item.shard_id} ({item.pair.label}, {item.dataset}/{item.turn}) failed "
                    f"{self._attempts[item.shard_id]} times; last error: {err}"
                ) from err
            pending[item.pair].appendleft(item)
            self.report.redispatched += 1
        print(f"worker for {worker.pair.label} died ({type(err).__name__}); re-dispatching {len(lost)} shard(s)",
              file=self.stream, flush=True)


def unit_counts(spec: GridSpec) -> Iterable[str]:
    """Lines for `--dry-run`: work units per dataset, turn, model pair and method set."""
    yield f"grid {spec.name}: {len(spec.configs())} configurations, {len(spec.units())} work units"
    for axis, counter in spec.counts().items():
        yield f"  by {axis}:"
        for name, n in counter.items():
            yield f"    {name}: {n}"
    samples = f"{spec.limit} samples each" if spec.limit else "all samples of each dataset"
    yield f"  ({samples}, shards of {spec.shard_size})"
