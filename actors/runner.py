"""Runs a validated grid on Ray: keep the actors of each model group (a target and its drafts)
busy, write each finished shard at once, survive dead actors, resume from what is written.
First turns run first; second turns (`pipeline.planning.samples`) are built from the target's
greedy first-turn answers as read back from the results dataset (docs/cluster.md, "Turns").
On CPU workers, shards with timed samples run first, on workers taking a whole node's CPUs as
threads, so no walltime shares its cores with another decode (a GPU worker owns its device).
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

import ray

from actors.ray_info import cpu_slots, fitting_nodes, last_error_line, node_cpus
from actors.target_worker import remote_worker
from actors.progress import Progress
from pipeline.drafting.methods import needs_captions
from pipeline.planning.grid import FIRST_TURN, GridSpec, ModelGroup, Pair, Shard
from pipeline.planning.samples import RegistrySource, RunSamples, SampleSource
from pipeline.planning.resume import reconcile, wanted_rows
from pipeline.planning.shards import plan_shards
from pipeline.results.run_lock import run_lock
from pipeline.results.manifest import grid_record, record_grid
from pipeline.results.store import drop_rows, first_turn_answers, quarantine_unreadable, write_shards, written_rows

IN_FLIGHT_PER_WORKER = 2  # one running, one queued behind it, so a worker never waits on the driver
POLL_S = 10.0  # how often a waiting driver checks that the cluster can still run its workers
PLACEMENT_TIMEOUT_S = 900.0  # a worker not placed on any node by then never will be
CPUS_PER_WORKER = 1  # default CPUs (threads) of an actor


class RunFailed(RuntimeError):
    """The run cannot go on. What is written stays written; a rerun resumes from it."""


@dataclass
class RunReport:
    shards_planned: int = 0  # shards with rows still to compute when planned
    shards_written: int = 0
    rows_written: int = 0
    rows_skipped: int = 0  # already present from an earlier run
    rows_recomputed: int = 0  # written earlier, dropped and computed again (pipeline.planning.resume)
    redispatched: int = 0
    seconds: float = 0.0


@dataclass
class _Worker:
    group: ModelGroup
    handle: object
    placed: object | None  # ObjectRef resolving once the actor runs (placed, models loaded); None after
    started: float = field(default_factory=time.monotonic)
    in_flight: dict = field(default_factory=dict)  # ObjectRef -> Shard


class GridRunner:
    """Drives one run of a grid. `on_shard_written(path, runner)` is called after every file written
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
        cpus_per_worker: float = CPUS_PER_WORKER,
        max_attempts: int = 3,
        poll_s: float = POLL_S,
        placement_timeout_s: float = PLACEMENT_TIMEOUT_S,
        on_shard_written: Callable[[Path, "GridRunner"], None] | None = None,
        stream: TextIO = sys.stdout,
    ) -> None:
        self.spec, self.out = spec, Path(out)
        self.samples = RunSamples(spec, source or RegistrySource.for_grid(spec), self._first_turn_answers)
        self.run_name = run or spec.name
        self.requested_workers, self.gpus_per_worker, self.cpus_per_worker = workers, gpus_per_worker, cpus_per_worker
        self.max_attempts, self.poll_s, self.placement_timeout_s = max_attempts, poll_s, placement_timeout_s
        self.on_shard_written = on_shard_written
        self.stream = stream
        self.workers: list[_Worker] = []
        self.report = RunReport()
        self._attempts: dict[str, int] = defaultdict(int)
        self._cpus = cpus_per_worker  # of the workers running now
        self._captioner = spec.captioner if any(needs_captions(m) for m in spec.methods) else None  # for the actors

    def _first_turn_answers(self, pair: Pair, dataset: str, max_new_tokens: int) -> dict[str, str]:
        return first_turn_answers(self.out, self.run_name, target=pair.target, dtype=pair.dtype,
                                  dataset=dataset, max_new_tokens=max_new_tokens)

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> RunReport:
        """Every phase (first turn, then second turns) under the run's lock."""
        start = time.monotonic()
        phases = [("first turn", [FIRST_TURN])] if FIRST_TURN in self.spec.turns else []
        if self.spec.second_turns:
            phases.append(("second turn", list(self.spec.second_turns)))
        with run_lock(self.out, self.run_name):
            moved, folder = quarantine_unreadable(self.out, self.run_name)
            if moved:
                print(f"moved {len(moved)} unreadable shard file(s) aside to {folder}; their rows are computed again",
                      file=self.stream, flush=True)
            record_grid(self.out, self.run_name, grid_record(self.spec, self.samples.first_turn_count))
            try:
                for label, turns in phases:
                    self._run_phase(label, turns)
            finally:
                self._stop_workers()
                self.report.seconds = time.monotonic() - start
        return self.report

    def _run_phase(self, label: str, turns: list[str]) -> None:
        """Sort the rows already written (pipeline.planning.resume), drop those to compute
        again, then plan and dispatch the rest."""
        units = self.spec.units(turns)
        resume = reconcile(written_rows(self.out, self.run_name, turns), wanted_rows(units, self.samples.for_unit))
        if resume.recompute:
            drop_rows(self.out, self.run_name, set(resume.recompute))
        for line in resume.lines():
            print(f"[{label}] {line}", file=self.stream, flush=True)
        planned = plan_shards(
            self.run_name, units, self.samples.for_unit, shard_size=self.spec.shard_size,
            grid_mode=self.spec.mode, live_samples=self.spec.live_samples,
            live_seed=self.spec.live_seed, untimed=frozenset(self.spec.untimed + self.spec.untimed_verify), done=resume.keep,
        )
        self.report.rows_skipped += len(resume.keep)
        self.report.rows_recomputed += len(resume.recompute)
        self.report.shards_planned += len(planned)
        print(f"[{label}] {len(planned)} shards to run ({len(units)} work units)", file=self.stream, flush=True)
        if planned:
            self._dispatch(planned, Progress(label, planned, self.stream))

    def _stop_workers(self) -> None:
        for worker in self.workers:
            ray.kill(worker.handle)
        self.workers.clear()

    def _worker_count(self, cpus: float) -> tuple[int, float]:
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0.0)
        per_worker = self.gpus_per_worker if self.gpus_per_worker is not None else (1.0 if gpus else 0.0)
        if per_worker > gpus:
            raise RunFailed(f"workers need {per_worker:g} GPU each but the Ray cluster has {gpus:g}")
        slots = max(1, int(gpus / per_worker) if per_worker else cpu_slots(cpus))
        # more actors than the cluster can place would hold shards that never run
        return min(self.requested_workers or slots, slots), per_worker

    def _dispatch(self, shards: list[Shard], progress: Progress) -> None:
        """Waves (module doc): timed shards first, so the untimed wave's workers go on to the next phase."""
        apart = not self._worker_count(self.cpus_per_worker)[1]
        self._dispatch_wave([s for s in shards if s.timed and apart], max(node_cpus(), self.cpus_per_worker), progress)
        self._dispatch_wave([s for s in shards if not (s.timed and apart)], self.cpus_per_worker, progress)

    def _dispatch_wave(self, shards: list[Shard], cpus: float, progress: Progress) -> None:
        """Keep every worker (of `cpus` CPUs) busy until each shard is written (or has failed too often)."""
        if not shards:
            return
        if cpus != self._cpus:  # the last wave's workers are idle and the wrong size
            self._stop_workers()
        self._cpus = cpus
        self._slots, self._gpus = self._worker_count(cpus)
        self._pending: dict[ModelGroup, deque[Shard]] = defaultdict(deque)
        for shard in shards:
            self._pending[shard.group].append(shard)
        self._fill()
        while any(w.in_flight or w.placed is not None for w in self.workers):
            self._collect_one(progress)
            self._fill()

    def _fill(self) -> None:
        """Top up every worker's queue, then start workers for the groups with the most shards
        waiting per worker, recycling a worker whose group has nothing left when all slots are taken."""
        for worker in self.workers:
            self._top_up(worker)
        while (group := self._neediest_group()) is not None:
            if len(self.workers) >= self._slots:
                idle = next((w for w in self.workers if not self._pending[w.group] and not w.in_flight), None)
                if idle is None:
                    return
                ray.kill(idle.handle)
                self.workers.remove(idle)
            allow_text = any(pair in self.spec.text_only for pair in group.pairs)
            handle = remote_worker(group, self._captioner, num_gpus=self._gpus, num_cpus=self._cpus,
                                   threads=None if self._gpus else max(1, int(self._cpus)),
                                   drafting_methods=self.spec.drafting_methods, allow_text=allow_text)
            probe = handle.device_name.options(max_task_retries=0).remote()  # fails once, quietly, if a model cannot load
            self.workers.append(_Worker(group, handle, probe))
            self._top_up(self.workers[-1])

    def _top_up(self, worker: _Worker) -> None:
        """Queue shards on a running worker; one still starting gets none, so a model that
        cannot load fails once (its start) rather than once per shard sent to it."""
        if worker.placed is not None:
            return
        queue = self._pending[worker.group]
        while queue and len(worker.in_flight) < IN_FLIGHT_PER_WORKER:
            self._submit(worker, queue.popleft())

    def _neediest_group(self) -> ModelGroup | None:
        live = defaultdict(int)
        for worker in self.workers:
            live[worker.group] += 1
        waiting = [group for group, queue in self._pending.items() if queue]
        return max(waiting, key=lambda group: len(self._pending[group]) / (live[group] + 1), default=None)

    def _collect_one(self, progress: Progress) -> None:
        """Wait for the next finished shard or worker start: write the shard, take the started
        worker into service, or re-dispatch a dead worker's shards."""
        starting = {w.placed: w for w in self.workers if w.placed is not None}
        refs = [ref for w in self.workers for ref in w.in_flight] + list(starting)
        while not (ready := ray.wait(refs, num_returns=1, timeout=self.poll_s)[0]):
            self._check_cluster()
        ref = ready[0]
        if ref in starting:
            self._started(starting[ref])
            return
        worker = next(w for w in self.workers if ref in w.in_flight)
        shard = worker.in_flight.pop(ref)
        try:
            table = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            if err.actor_init_failed:  # loading a model failed: deterministic, retrying cannot help
                raise self._cannot_start(worker, err) from None
            self._redispatch(worker, shard, err)
            return
        except ray.exceptions.RayTaskError as err:  # the shard itself failed (per-sample errors are rows)
            self._retry(shard, err)
            return
        paths = write_shards(self.out, table)
        self.report.shards_written += 1
        self.report.rows_written += table.num_rows
        progress.advance(shard, table.num_rows)
        for path in paths if self.on_shard_written else ():
            self.on_shard_written(path, self)

    def _started(self, worker: _Worker) -> None:
        """A worker's start finished: it takes shards from now on, or the run ends when its
        models cannot load (deterministic: another start would fail the same way)."""
        try:
            ray.get(worker.placed)
        except ray.exceptions.RayActorError as err:
            if err.actor_init_failed:
                raise self._cannot_start(worker, err) from None
            self.workers.remove(worker)  # lost before it ran (its node died): _fill starts another
            ray.kill(worker.handle)
            return
        worker.placed = None

    @staticmethod
    def _cannot_start(worker: _Worker, err: Exception) -> RunFailed:
        return RunFailed(f"the worker for {worker.group.label} could not start: {last_error_line(err)}")

    def _submit(self, worker: _Worker, shard: Shard) -> None:
        samples = {sid: self.samples.get(shard.group, sid) for sid in shard.sample_ids}
        worker.in_flight[worker.handle.run_shard.remote(shard, samples)] = shard

    def _redispatch(self, worker: _Worker, shard: Shard, err: Exception) -> None:
        """The actor is gone for good (Ray's restarts used up): replace it, queue its shards again."""
        lost = [shard, *worker.in_flight.values()]
        worker.in_flight.clear()
        if worker in self.workers:
            self.workers.remove(worker)
            ray.kill(worker.handle)
        print(f"worker for {worker.group.label} died ({type(err).__name__}); re-dispatching {len(lost)} shard(s)",
              file=self.stream, flush=True)
        for item in lost:
            self._retry(item, err)

    def _retry(self, shard: Shard, err: Exception) -> None:
        self._attempts[shard.shard_id] += 1
        if self._attempts[shard.shard_id] >= self.max_attempts:
            raise RunFailed(
                f"shard {shard.shard_id} ({shard.group.label}, {shard.dataset}/{shard.turn}) failed "
                f"{self._attempts[shard.shard_id]} times; last error: {last_error_line(err)}"
            ) from None
        self._pending[shard.group].appendleft(shard)
        self.report.redispatched += 1

    def _check_cluster(self) -> None:
        """While nothing finishes: end the run if no live node can host a worker (the last
        one that could has died) or a worker has waited too long to be placed; Ray itself
        would wait for capacity forever."""
        if not fitting_nodes(self._gpus, self._cpus):
            raise RunFailed(f"no live node in the Ray cluster can host a worker ({self._gpus:g} GPU, "
                            f"{self._cpus:g} CPU each); the nodes that could have left")
        for worker in self.workers:
            waited = time.monotonic() - worker.started
            if worker.placed is not None and waited > self.placement_timeout_s:
                raise RunFailed(f"the worker for {worker.group.label} was not placed on any node in {waited:.0f} s")
