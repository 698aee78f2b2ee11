"""One run of a validated grid on Ray: under the run's lock, resume from what is written, plan
the shards still to compute, let the worker pool (`actors.worker_pool`) run them and write each
finished shard at once. First turns run first; each later turn (`pipeline.planning.samples`)
is built from the target's greedy answers to the turn before it as read back from the results
dataset, so turns run in phases by their place in the conversation (docs/cluster.md, "Turns").
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

import pyarrow as pa

from actors.progress import Progress
from actors.worker_pool import (
    CPUS_PER_WORKER, PLACEMENT_TIMEOUT_S, POLL_S, RunFailed, Worker, WorkerOptions, WorkerPool,
)
from pipeline.data.sample import turn_index
from pipeline.drafting.methods import needs_captions
from pipeline.planning.grid import GridSpec, Pair, Shard
from pipeline.planning.resume import reconcile, wanted_rows
from pipeline.planning.samples import RegistrySource, RunSamples, SampleSource
from pipeline.planning.shards import plan_shards
from pipeline.storage.compaction import recover
from pipeline.storage.manifest import grid_record, record_grid
from pipeline.storage.run_lock import run_lock
from pipeline.storage.store import (
    drop_rows, quarantine_unreadable, turn_answers, write_shards, written_rows,
)

__all__ = ["GridRunner", "RunFailed", "RunReport"]
PHASES = ("first turn", "second turn", "third turn", "fourth turn")  # by `turn_index`


@dataclass
class RunReport:
    shards_planned: int = 0  # shards with rows still to compute when planned
    shards_written: int = 0
    rows_written: int = 0
    rows_skipped: int = 0  # already present from an earlier run
    rows_recomputed: int = 0  # written earlier, dropped and computed again (pipeline.planning.resume)
    redispatched: int = 0
    seconds: float = 0.0


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
        self.samples = RunSamples(spec, source or RegistrySource.for_grid(spec), self._turn_answers)
        self.run_name = run or spec.name
        self.on_shard_written = on_shard_written
        self.stream = stream
        self.report = RunReport()
        captioner = spec.captioner if any(needs_captions(m) for m in spec.methods) else None  # for the actors
        options = WorkerOptions(workers, gpus_per_worker, cpus_per_worker, captioner, spec.drafting_methods,
                                spec.text_only, spec.timed_repeats, spec.spread)
        self.pool = WorkerPool(options, self.samples.get, self._write, self._count_redispatch,
                               max_attempts=max_attempts, poll_s=poll_s,
                               placement_timeout_s=placement_timeout_s, stream=stream)
        self._progress: Progress | None = None

    @property
    def workers(self) -> list[Worker]:
        """The pool's workers now (a test kills one mid-run)."""
        return self.pool.workers

    def _turn_answers(self, pair: Pair, dataset: str, turn: str, max_new_tokens: int) -> dict[str, str]:
        return turn_answers(self.out, self.run_name, target=pair.target, dtype=pair.dtype,
                            dataset=dataset, turn=turn, max_new_tokens=max_new_tokens)

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> RunReport:
        """Every phase (first turn, second turns, then the later follow-ups) under the run's lock."""
        start = time.monotonic()
        phases: dict[int, list[str]] = {}
        for turn in sorted(self.spec.turns, key=turn_index):
            phases.setdefault(turn_index(turn), []).append(turn)
        with run_lock(self.out, self.run_name):
            recover(self.out, self.run_name)  # what a killed `jobs/compact.py` left
            moved, folder = quarantine_unreadable(self.out, self.run_name)
            if moved:
                print(f"moved {len(moved)} unreadable shard file(s) aside to {folder}; "
                      "their rows are computed again",
                      file=self.stream, flush=True)
            record_grid(self.out, self.run_name, grid_record(self.spec, self.samples.count))
            try:
                for index, turns in phases.items():
                    self._run_phase(PHASES[index], turns)
            finally:
                self.pool.stop()
                self.report.seconds = time.monotonic() - start
        return self.report

    def _run_phase(self, label: str, turns: list[str]) -> None:
        """Sort the rows already written (pipeline.planning.resume), drop those to compute
        again, then plan and dispatch the rest."""
        units = self.spec.units(turns)
        resume = reconcile(written_rows(self.out, self.run_name, turns),
                           wanted_rows(units, self.samples.for_unit))
        if resume.recompute:
            drop_rows(self.out, self.run_name, set(resume.recompute))
        for line in resume.lines():
            print(f"[{label}] {line}", file=self.stream, flush=True)
        planned = plan_shards(
            self.run_name, units, self.samples.for_unit, shard_size=self.spec.shard_size,
            grid_mode=self.spec.mode, timed=self.samples.timed_ids(),
            untimed=frozenset(self.spec.untimed + self.spec.untimed_verify),
            timed_only=frozenset(self.spec.timed_only), done=resume.keep,
        )
        self.report.rows_skipped += len(resume.keep)
        self.report.rows_recomputed += len(resume.recompute)
        self.report.shards_planned += len(planned)
        print(f"[{label}] {len(planned)} shards to run ({len(units)} work units)", file=self.stream,
              flush=True)
        if planned:
            self._progress = Progress(label, planned, self.stream)
            self.pool.run(planned)

    def _write(self, shard: Shard, table: pa.Table) -> None:
        """A finished shard, written at once."""
        paths = write_shards(self.out, table)
        self.report.shards_written += 1
        self.report.rows_written += table.num_rows
        self._progress.advance(shard, table.num_rows)
        for path in paths if self.on_shard_written else ():
            self.on_shard_written(path, self)

    def _count_redispatch(self, more_shards: int) -> None:
        """A shard queued again, split into `more_shards` + 1 (a dead worker's: `actors.worker_pool`)."""
        self.report.redispatched += 1
        self._progress.split(more_shards)
