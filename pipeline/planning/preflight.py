"""What a run checks before Ray starts or any model loads: everything about its input that can
be read from this machine. `load_grid` has already checked the grid file itself; here the
output directory must be writable, every dataset must yield samples (local copies opened,
columns present, not empty), question copies for second turns must open, and hub ids must
resolve (in the local cache, or answered by the hub within seconds). Each failure is a
`GridError` line naming the entry.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.planning.grid import GridError, GridSpec
from pipeline.planning.model_ids import check_hub_id_resolves
from pipeline.planning.problems import Problems
from pipeline.planning.samples import SampleSource

QUESTION_TASKS_NEED = 1  # one question proves a copy opens and has the column


def check_output_dir(out: str | Path) -> None:
    """The results directory exists (or can be made) and takes a file."""
    path = Path(out).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise GridError(f"--out {out}: cannot write results there: {err.strerror or err}") from err


def check_models(spec: GridSpec) -> None:
    """Every hub id resolves: cached here, or answered by the hub (their families, where a
    config is readable here, were checked with the grid file). Ids are checked side by side,
    so a grid of many pairs waits one timeout at most; every failure is reported."""
    named = {getattr(pair, role): f"pairs[{i}].{role}" for i, pair in enumerate(spec.pairs) for role in ("target", "draft")}
    problems = Problems()
    with ThreadPoolExecutor(max_workers=8) as pool:
        for done in [pool.submit(problems.check, check_hub_id_resolves, name, where) for name, where in named.items()]:
            done.result()
    problems.raise_all()


def check_samples(spec: GridSpec, source: SampleSource) -> None:
    """Load every dataset's first turn (the run reuses what `source` caches) and open the
    local question copies that second turns read. A row of the grid's own files that cannot
    become a prompt (an image path that does not exist, an empty question) stops the run
    here: it is the user's file to fix, where a bad row of a public dataset is recorded."""
    from pipeline.data import DataSourceError
    from pipeline.data.turns import QUESTION_SETS, load_questions

    own_files = {user.name for user in spec.user_datasets}
    for i, dataset in enumerate(spec.datasets):
        try:
            samples = source.first_turn(dataset, spec.limit)
        except (DataSourceError, ValueError, OSError) as err:
            raise GridError(f"datasets[{i}] {dataset!r}: {_first_line(err)}") from err
        if not samples:
            raise GridError(f"datasets[{i}] {dataset!r}: no rows to run (is its source empty?)")
        bad = next((s for s in samples if s.error), None) if dataset in own_files else None
        if bad is not None:
            raise GridError(f"datasets[{i}] {dataset!r} row {bad.row}: {bad.error.split(': ', 1)[-1]}")
    for task, path in spec.sources:
        if task in QUESTION_SETS and task in spec.turns:
            try:
                load_questions(task, QUESTION_TASKS_NEED, source=path)
            except (DataSourceError, ValueError, OSError) as err:
                raise GridError(f"sources.{task}: {_first_line(err)}") from err


def preflight(spec: GridSpec, out: str | Path, source: SampleSource) -> None:
    check_output_dir(out)
    check_models(spec)
    check_samples(spec, source)


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
