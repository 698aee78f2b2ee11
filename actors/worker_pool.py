"""The Ray actors of a run and the shards queued on them: keep every worker busy, replace dead
ones, retry failed shards, and hand each finished table back to the run (`actors.runner`).

On CPU workers, shards with timed samples run first, on workers taking a whole node's CPUs as
threads, so no walltime shares its cores with another decode (a GPU worker owns its device).

A sample that kills its worker process (an OOM kill, a segfault in a kernel) is isolated rather
than retried until the run gives up: the shards a dead worker held become suspects, split in
halves by sample, and run alone on a worker, one at a time, without Ray's retries; a suspect of
one sample whose worker dies again is that sample's fault, and its rows are written as failed
rows naming the cause, while the rest of the run goes on.
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from typing import Callable, TextIO

import pyarrow as pa
import ray

from actors.ray_info import cpu_slots, fitting_nodes, last_error_line, node_cpus
from actors.target_worker import remote_worker
from pipeline.data.sample import Sample
from pipeline.decoding.records import SampleRecord
from pipeline.planning.grid import GridSpec, ModelGroup, Shard
from pipeline.storage.schema import make_row
from pipeline.storage.store import rows_to_table

IN_FLIGHT_PER_WORKER = 2  # one running, one queued behind it, so a worker never waits on the driver
POLL_S = 10.0  # how often a waiting driver checks that the cluster can still run its workers
PLACEMENT_TIMEOUT_S = 900.0  # a worker not placed on any node by then never will be
CPUS_PER_WORKER = 1  # default CPUs (threads) of an actor


class RunFailed(RuntimeError):
    """The run cannot go on. What is written stays written; a rerun resumes from it."""


@dataclass
class Worker:
    group: ModelGroup
    handle: object
    placed: object | None  # ObjectRef resolving once the actor runs (placed, models loaded); None after
    started: float = field(default_factory=time.monotonic)
    in_flight: dict = field(default_factory=dict)  # ObjectRef -> Shard


@dataclass
class WorkerOptions:
    """How the pool starts workers: `workers` at most (None: as many as fit), GPUs and CPUs
    each (GPUs None: one where the cluster has them), the grid's captioner, its own drafting
    methods, its `text_only` pairs, how often a timed sample's decodes run, and the targets
    whose actors hold more GPUs (`GridSpec.spread`: the target spread over them)."""

    workers: int | None = None
    gpus_per_worker: float | None = None
    cpus_per_worker: float = CPUS_PER_WORKER
    captioner: str | None = None
    drafting_methods: tuple[str, ...] = ()
    text_only: tuple = ()
    timed_repeats: int = GridSpec.timed_repeats
    spread: tuple[tuple[str, str, int], ...] = ()


class WorkerPool:
    """Runs shards on Ray actors, one model group per actor. `samples(group, sample_id)` gives
    the samples a shard needs; `finished(shard, table)` takes each table as it arrives;
    `redispatched(more)` counts a retried shard, `more` the shards it was split into beyond one."""

    def __init__(
        self, options: WorkerOptions, samples: Callable[[ModelGroup, str], Sample],
        finished: Callable[[Shard, pa.Table], None], redispatched: Callable[[int], None], *,
        max_attempts: int = 3, poll_s: float = POLL_S, placement_timeout_s: float = PLACEMENT_TIMEOUT_S,
        stream: TextIO = sys.stdout,
    ) -> None:
        self.options, self.samples = options, samples
        self.finished, self.redispatched = finished, redispatched
        self.max_attempts, self.poll_s, self.placement_timeout_s = max_attempts, poll_s, placement_timeout_s
        self.stream = stream
        self.workers: list[Worker] = []
        self._attempts: dict[str, int] = defaultdict(int)
        self._suspects: set[str] = set()  # shards a dead worker held: run alone, split on death
        self._cpus = options.cpus_per_worker  # of the workers running now
        self._spread = {(target, dtype): gpus for target, dtype, gpus in options.spread}

    def run(self, shards: list[Shard]) -> None:
        """Every shard to a worker until it is written (or has failed too often), in waves:
        timed shards first, so the untimed wave's workers go on to the next phase."""
        apart = not self._worker_count(self.options.cpus_per_worker)[1]
        self._wave([s for s in shards if s.timed and apart], max(node_cpus(), self.options.cpus_per_worker))
        self._wave([s for s in shards if not (s.timed and apart)], self.options.cpus_per_worker)

    def stop(self) -> None:
        for worker in self.workers:
            ray.kill(worker.handle)
        self.workers.clear()

    def _worker_count(self, cpus: float) -> tuple[int, float]:
        resources = ray.cluster_resources()
        gpus = resources.get("GPU", 0.0)
        wanted = self.options.gpus_per_worker
        per_worker = wanted if wanted is not None else (1.0 if gpus else 0.0)
        if per_worker > gpus:
            raise RunFailed(f"workers need {per_worker:g} GPU each but the Ray cluster has {gpus:g}")
        slots = max(1, int(gpus / per_worker) if per_worker else cpu_slots(cpus))
        # more actors than the cluster can place would hold shards that never run
        return min(self.options.workers or slots, slots), per_worker

    def _wave(self, shards: list[Shard], cpus: float) -> None:
        """Keep every worker (of `cpus` CPUs) busy until each shard is written (or has failed too often)."""
        if not shards:
            return
        if cpus != self._cpus:  # the last wave's workers are idle and the wrong size
            self.stop()
        self._cpus = cpus
        self._slots, self._gpus = self._worker_count(cpus)
        self._pending: dict[ModelGroup, deque[Shard]] = defaultdict(deque)
        for shard in shards:
            self._pending[shard.group].append(shard)
        for group in self._pending:
            if self._need(group) > self._gpus and not fitting_nodes(self._need(group), cpus):
                raise RunFailed(f"{group.label} needs {self._need(group):g} GPUs in one worker (its pair's "
                                "`gpus:`), and no live node of the Ray cluster has that many")
        self._fill()
        while any(w.in_flight or w.placed is not None for w in self.workers):
            self._collect_one()
            self._fill()

    def _fill(self) -> None:
        """Top up every worker's queue, then start workers for the groups with the most shards
        waiting per worker, recycling a worker whose group has nothing left when all slots are taken."""
        for worker in self.workers:
            self._top_up(worker)
        while (group := self._neediest_group()) is not None:
            while not self._room_for(group):
                idle = next((w for w in self.workers if not self._pending[w.group] and not w.in_flight), None)
                if idle is None:
                    return
                ray.kill(idle.handle)
                self.workers.remove(idle)
            options = self.options
            allow_text = any(pair in options.text_only for pair in group.pairs)
            handle = remote_worker(group, options.captioner, num_gpus=self._need(group), num_cpus=self._cpus,
                                   threads=None if self._gpus else max(1, int(self._cpus)),
                                   drafting_methods=options.drafting_methods, allow_text=allow_text,
                                   timed_repeats=options.timed_repeats)
            # fails once, quietly, if a model cannot load
            probe = handle.device_name.options(max_task_retries=0).remote()
            self.workers.append(Worker(group, handle, probe))
            self._top_up(self.workers[-1])

    def _top_up(self, worker: Worker) -> None:
        """Queue shards on a running worker; one still starting gets none, so a model that
        cannot load fails once (its start) rather than once per shard sent to it."""
        if worker.placed is not None:
            return
        queue = self._pending[worker.group]
        while queue and len(worker.in_flight) < IN_FLIGHT_PER_WORKER:
            suspect = queue[0].shard_id in self._suspects
            running = {s.shard_id for s in worker.in_flight.values()}
            if running and (suspect or running & self._suspects):
                return  # a suspect runs alone, so that a death is its own
            shard = queue.popleft()
            samples = {sid: self.samples(shard.group, sid) for sid in shard.sample_ids}
            call = worker.handle.run_shard.options(max_task_retries=0) if suspect else worker.handle.run_shard
            worker.in_flight[call.remote(shard, samples)] = shard

    def _need(self, group: ModelGroup) -> float:
        """GPUs a worker of `group` holds: its pair's `gpus:`, else every worker's."""
        return self._spread.get((group.target, group.dtype), self._gpus)

    def _room_for(self, group: ModelGroup) -> bool:
        """Whether a worker of `group` fits beside the running ones: within the worker slots and,
        on GPUs, within the cluster's GPUs (workers of a spread target hold several)."""
        if len(self.workers) >= self._slots:
            return False
        total = ray.cluster_resources().get("GPU", 0.0)
        return not total or sum(self._need(w.group) for w in self.workers) + self._need(group) <= total

    def _neediest_group(self) -> ModelGroup | None:
        live = defaultdict(int)
        for worker in self.workers:
            live[worker.group] += 1
        waiting = [group for group, queue in self._pending.items() if queue]
        return max(waiting, key=lambda group: len(self._pending[group]) / (live[group] + 1), default=None)

    def _collect_one(self) -> None:
        """Wait for the next finished shard or worker start: hand the table on, take the
        started worker into service, or re-dispatch a dead worker's shards."""
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
        self.finished(shard, table)

    def _started(self, worker: Worker) -> None:
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
    def _cannot_start(worker: Worker, err: Exception) -> RunFailed:
        return RunFailed(f"the worker for {worker.group.label} could not start: {last_error_line(err)}")

    def _redispatch(self, worker: Worker, shard: Shard, err: Exception) -> None:
        """The actor is gone for good (Ray's restarts used up, or a suspect's one life): replace
        it and queue its shards again as suspects, halved; a suspect of one sample that ran alone
        and died is written as that sample's failed rows."""
        lost = [shard, *worker.in_flight.values()]
        worker.in_flight.clear()
        if worker in self.workers:
            self.workers.remove(worker)
            ray.kill(worker.handle)
        print(f"worker for {worker.group.label} died ({type(err).__name__}); "
              f"re-dispatching {len(lost)} shard(s) as suspects",
              file=self.stream, flush=True)
        for item in lost:
            if item.shard_id in self._suspects and len(item.sample_ids) == 1:
                print(f"sample {item.sample_ids[0]} ({item.group.label}) killed its worker each time; "
                      "its rows are written as failed", file=self.stream, flush=True)
                self.finished(item, self._failed_rows(item, err))
                continue
            halves = split_shard(item)
            self._suspects.update(half.shard_id for half in halves)
            for half in reversed(halves):
                self._pending[item.group].appendleft(half)
            self.redispatched(len(halves) - 1)

    def _failed_rows(self, shard: Shard, err: Exception) -> pa.Table:
        cause = f"the worker process died whenever it decoded this sample ({last_error_line(err)[:300]})"
        sample = self.samples(shard.group, shard.sample_ids[0])

        def record(config) -> SampleRecord:
            mode = "ar" if config.decode.is_ar else "replay" if shard.mode == "replay" else "live"
            return SampleRecord(sample_id=sample.sample_id, mode=mode, error=cause, error_category="model")

        return rows_to_table([make_row(shard.run, shard.shard_id, config, sample, record(config),
                                       sample.sample_id in shard.timed) for config, _ in shard.items])

    def _retry(self, shard: Shard, err: Exception) -> None:
        self._attempts[shard.shard_id] += 1
        if self._attempts[shard.shard_id] >= self.max_attempts:
            raise RunFailed(
                f"shard {shard.shard_id} ({shard.group.label}, {shard.dataset}/{shard.turn}) failed "
                f"{self._attempts[shard.shard_id]} times; last error: {last_error_line(err)}"
            ) from None
        self._pending[shard.group].appendleft(shard)
        self.redispatched(0)

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
                raise RunFailed(f"the worker for {worker.group.label} was not placed on any node "
                                f"in {waited:.0f} s")


def split_shard(shard: Shard) -> list[Shard]:
    """`shard` as two shards of half its samples each (one sample: itself), every sample's
    configurations kept together; their ids differ from the whole's, so nothing is written twice."""
    samples = shard.sample_ids
    if len(samples) == 1:
        return [shard]
    halves = (set(samples[: len(samples) // 2]), set(samples[len(samples) // 2:]))
    return [replace(shard, items=tuple(item for item in shard.items if item[1] in half),
                    prompt_hashes=tuple(pair for pair in shard.prompt_hashes if pair[0] in half),
                    timed=tuple(sid for sid in shard.timed if sid in half)) for half in halves]
