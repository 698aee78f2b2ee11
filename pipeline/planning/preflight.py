"""What a run checks before Ray starts or any model loads: everything about its input that can
be read from this machine. `load_grid` has already checked the grid file itself; here the
output directory must be writable, every dataset must yield samples (local copies opened,
columns present, not empty), question copies for second turns must open, and hub ids must
resolve (in the local cache, or answered by the hub within seconds), and the output folder's
disk must take the run's rows and report (a real write, and the free space against a size
estimated from the expected rows). Each failure is a `GridError` line naming the entry.
"""
from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.data.sample import turn_count
from pipeline.models.head_names import head_kind, head_path
from pipeline.models.lookup_names import model_of
from pipeline.planning.grid import TINY_PREFIX, GridError, GridSpec
from pipeline.planning.model_ids import (
    check_head_here, check_hub_id_resolves, check_same_tokenizer, context_length, fetch_config,
    fetch_tokenizer,
)
from pipeline.planning.problems import Problems
from pipeline.planning.samples import SampleSource

QUESTION_TASKS_NEED = 1  # one question proves a copy opens and has the column
# A result row of 64 new tokens takes about 530 bytes of Parquet (the embedded default: 3780 rows,
# 2.0 MB); four times that leaves room for longer answers. The report (tables, figures in three
# formats, calibrations) took 2.3 MB there; 32 MiB is room for large grids' figures.
BYTES_PER_ROW = 2048
REPORT_BYTES = 32 << 20
PROBE_BYTES = 64 << 10  # a probe with data in it: a zero-byte file is created even on a full disk


def check_output_dir(out: str | Path, rows: int = 0) -> None:
    """The results directory exists (or can be made), takes a file with data in it (flushed to
    disk), and has room for `rows` result rows and a report."""
    path = Path(out).expanduser()
    probe = path / f".write-test-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        try:
            with open(probe, "wb") as f:
                f.write(b"\0" * PROBE_BYTES)
                f.flush()
                os.fsync(f.fileno())
        finally:
            probe.unlink(missing_ok=True)
        free = shutil.disk_usage(path).free
    except OSError as err:
        raise GridError(f"--out {out}: cannot write results there: {err.strerror or err}") from err
    needed = rows * BYTES_PER_ROW + REPORT_BYTES if rows else 0
    if free < needed:
        raise GridError(f"--out {out}: {_mib(free)} free on its disk; this run needs about {_mib(needed)} "
                        f"({rows} rows x {BYTES_PER_ROW} bytes, and {_mib(REPORT_BYTES)} for the report)")


def expected_rows(spec: GridSpec, source: SampleSource) -> int:
    """The rows a run of `spec` writes: a row per sample of every work unit."""
    return sum(turn_count(source.first_turn(unit.dataset, spec.limit), unit.turn)
               for unit in spec.units())


def _mib(size: int) -> str:
    return f"{size / (1 << 20):,.1f} MiB"


def check_models(spec: GridSpec) -> None:
    """Every hub id resolves: cached here, or answered by the hub (their families, where a
    config is readable here, were checked with the grid file); then the tokenizers the cache
    lacked are fetched, and each pair with one of them is compared (the others were when the
    grid was read). Ids are checked side by side, so a grid of many pairs waits one timeout at
    most; every failure is reported."""
    files = lambda name: (head_path(model_of(name)) if head_kind(model_of(name))
                          and not name.startswith(TINY_PREFIX) else model_of(name))
    named = {files(getattr(pair, role)): f"pairs[{i}].{role}"
             for i, pair in enumerate(spec.pairs) for role in ("target", "draft")}
    problems = Problems()
    with ThreadPoolExecutor(max_workers=8) as pool:
        for done in [pool.submit(problems.check, check_hub_id_resolves, name, where)
                     for name, where in named.items()]:
            done.result()
        problems.raise_all()
        fetched = {name for name, now in zip(named, pool.map(fetch_tokenizer, named)) if now}
    for i, pair in enumerate(spec.pairs):
        if {pair.target, files(pair.draft)} & fetched:
            problems.check(check_same_tokenizer, pair.target, pair.draft, f"pairs[{i}]")
        if files(pair.draft) != pair.draft:  # a hub or local head: its config against its target's
            for name in (files(pair.draft), pair.target):
                fetch_config(name)
            problems.check(check_head_here, pair.target, pair.draft, f"pairs[{i}].draft")
    problems.raise_all()


def check_context(spec: GridSpec) -> None:
    """`max_new_tokens` (and a block's proposals past it) must fit every target's context, read
    from its config where readable here (local dirs, cached hub ids; tiny: and embedded: models'
    are known) before any weight loads. A prompt too long for it is caught per sample, as an
    input error row."""
    problems = Problems()
    for i, pair in enumerate(spec.pairs):
        limit = context_length(pair.target)
        needed = spec.max_new_tokens + max(spec.gamma) + 1
        if limit is not None and needed > limit:
            problems.found.append(f"pairs[{i}].target: max_new_tokens {spec.max_new_tokens} "
                                  f"(+ gamma {max(spec.gamma)} + 1) needs {needed} positions after the "
                                  f"prompt; {pair.target} holds {limit}")
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
    check_context(spec)
    check_samples(spec, source)
    check_output_dir(out, expected_rows(spec, source))


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
