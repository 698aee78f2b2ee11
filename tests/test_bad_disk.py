"""A run survives what a bad disk and an operator do to it: unreadable shard files (truncated,
zero bytes, strays) are moved aside and their rows computed again with none lost or written
twice; a full disk ends in one line, leaves no lock and keeps the previous report whole; a lock
left empty is taken over; SIGTERM ends like Ctrl-C (exit 143, lock gone, how to resume)."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from pipeline.decoding.config import DecodeConfig
from pipeline.planning.grid import GridError
from pipeline.planning.preflight import check_output_dir
from pipeline.storage.run_lock import run_lock
from pipeline.storage.store import read_results, run_dir, write_shard
from tests.test_run_safety import PAIR, ROOT, RunConfig, rows_for, rows_to_table, sample

GRID = {"name": "g", "datasets": ["embedded_vqa", "embedded_describe"], "methods": ["AR", "M"], "limit": 3,
        "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}], "max_new_tokens": 6, "shard_size": 1}


def job(out: Path, grid: Path, *extra: str, patch: str = "",
        wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    """jobs/full_grid.py as a user runs it, with `patch` (Python) run first in its process."""
    env = {**os.environ, "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}
    code = f"import sys, runpy\n{patch}\nsys.argv = ['full_grid.py', *sys.argv[1:]]\nrunpy.run_path('jobs/full_grid.py', run_name='__main__')\n"
    command = [sys.executable, "-c", code, "--grid", str(grid), "--out", str(out), *extra]
    if not wait:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def rows_of(out: Path) -> pd.DataFrame:
    return read_results(out, "g")[["key", "output_text", "error"]].sort_values("key").reset_index(drop=True)


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("grid") / "g.yaml"
    path.write_text(json.dumps(GRID))
    return path


@pytest.mark.slow
def test_a_full_disk_ends_in_one_line_and_unreadable_shards_are_recomputed(tmp_path, grid):
    out = tmp_path / "out"
    full = ("import errno, pipeline.storage.store as store\n"
            "def full(*args): raise OSError(errno.ENOSPC, 'No space left on device', str(args[1]))\n"
            "store._write_atomically = full")
    stopped = job(out, grid, patch=full)
    lines = [line for line in stopped.stderr.splitlines() if line and not re.match(r"\d{4}-\d\d-\d\d ", line)]  # not Ray's log
    assert stopped.returncode == 1 and "no space left on the disk: could not write" in stopped.stderr, \
        stopped.stderr[-3000:]
    assert len(lines) == 1 and "rerun the same command" in lines[0] and "Traceback" not in stopped.stderr, lines
    assert not (run_dir(out, "g") / ".lock").exists() and not list(out.rglob(".*.tmp"))

    done = job(out, grid, "--no-compact")  # the rerun completes: the undisturbed run, a file per shard
    assert done.returncode == 0, done.stderr[-3000:]
    reference = rows_of(out)
    assert len(reference) == 2 * 3 * 2 and reference["key"].is_unique  # 2 datasets x 3 samples x (AR, M)

    files = sorted(run_dir(out, "g").rglob("part-*.parquet"))
    truncated, emptied = files[0], files[1]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    emptied.write_bytes(b"")
    (truncated.parent / "part-x.parquet").write_bytes(b"")  # dropped into a partition
    (run_dir(out, "g") / "part-y.parquet").write_bytes(b"")  # and outside the layout
    (out / "part-z.parquet").write_bytes(b"")
    summarized = subprocess.run([sys.executable, "jobs/summarize.py", str(out)], cwd=ROOT, capture_output=True,
                                text=True, timeout=300)
    assert summarized.returncode == 0 and "Traceback" not in summarized.stderr, summarized.stderr[-3000:]
    assert {f"skipped {p}" for p in (truncated, emptied, truncated.parent / "part-x.parquet")} == {
        line.split(":")[0] for line in summarized.stderr.splitlines() if line.startswith("skipped")}

    resumed = job(out, grid)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "moved 3 unreadable shard file(s) aside" in resumed.stdout
    assert rows_of(out).equals(reference)  # nothing lost, nothing twice, the same answers
    assert len(list((run_dir(out, "g") / "_quarantine").rglob("*.parquet"))) == 3


@pytest.mark.slow
def test_sigterm_ends_like_ctrl_c(tmp_path, grid):
    out = tmp_path / "out"
    slow = ("import time, pipeline.storage.store as store\nwrite = store.write_shards\n"
            "def slowly(*args):\n    time.sleep(1)\n    return write(*args)\nstore.write_shards = slowly")
    driver = job(out, grid, patch=slow, wait=False)
    deadline = time.monotonic() + 180
    for line in driver.stdout:
        if "shards to run" in line or time.monotonic() > deadline:
            break
    time.sleep(3)  # the driver is waiting on Ray now (its workers start), where SIGTERM once ended as 130
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 143, err[-3000:]
    assert "terminated; rerun the same command to resume" in err and "Traceback" not in err, err[-3000:]
    assert not (run_dir(out, "g") / ".lock").exists()


def test_a_lock_left_empty_or_unparsable_is_taken_over(tmp_path):
    lock = run_dir(tmp_path, "r") / ".lock"
    lock.parent.mkdir(parents=True)
    for leftover in (b"", b'{"host": "this-h'):
        lock.write_bytes(leftover)
        with run_lock(tmp_path, "r") as held:
            assert json.loads(held.read_text())["pid"] == os.getpid()
        assert not lock.exists()


def test_a_full_disk_while_taking_the_lock_leaves_no_lock(tmp_path, monkeypatch):
    import pipeline.storage.run_lock as run_lock_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_lock_module.json, "dump", full)
    with pytest.raises(OSError):
        with run_lock(tmp_path, "r"):
            pass
    assert not (run_dir(tmp_path, "r") / ".lock").exists() and not list(run_dir(tmp_path, "r").iterdir())


def test_a_full_disk_while_reporting_keeps_the_previous_report(tmp_path, monkeypatch):
    import pipeline.reports.summary as summary

    config = RunConfig(PAIR, DecodeConfig("M"))
    write_shard(tmp_path, rows_to_table(rows_for(config, [sample(0)], "s1")))
    summary.write_summary(tmp_path, "r", read_results(tmp_path, "r"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "_report-r").iterdir()}
    write_shard(tmp_path, rows_to_table(rows_for(config, [sample(1), sample(2)], "s2")))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(summary, "paper_tables", full)  # partway: after the tables' CSVs
    with pytest.raises(OSError):
        summary.write_summary(tmp_path, "r", read_results(tmp_path, "r"))
    assert {p.name: p.read_bytes() for p in (tmp_path / "_report-r").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_report-r", "run=r"]  # no half-written folder left


def test_preflight_checks_free_space_with_a_real_write(tmp_path, monkeypatch):
    import pipeline.planning.preflight as preflight

    check_output_dir(tmp_path, rows=1000)  # a few MiB: there is room here
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: SimpleNamespace(free=5 << 20))
    with pytest.raises(GridError, match=r"5.0 MiB free on its disk; this run needs about 34.0 MiB \(1000 rows"):
        check_output_dir(tmp_path, rows=1000)
    assert not list(tmp_path.iterdir())  # the probe is gone


def test_the_lock_works_where_files_cannot_be_hard_linked(tmp_path, monkeypatch):
    import pipeline.storage.run_lock as run_lock_module

    def no_links(*args):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(run_lock_module.os, "link", no_links)
    with run_lock(tmp_path, "r") as held:
        assert json.loads(held.read_text())["pid"] == os.getpid()
    assert not list(run_dir(tmp_path, "r").iterdir())


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_summarize_on_a_full_or_read_only_disk_says_so_in_one_line(tmp_path, monkeypatch, capsys, code):
    import jobs.summarize as summarize_job
    import pipeline.reports.summary as summary

    write_shard(tmp_path, rows_to_table(rows_for(RunConfig(PAIR, DecodeConfig("M")), [sample(0)], "s1")))

    def unwritable(*args, **kwargs):
        raise OSError(code, os.strerror(code), str(tmp_path / "_report-r" / "table1.tex"))

    monkeypatch.setattr(summary, "paper_tables", unwritable)
    assert summarize_job.main([str(tmp_path)]) == 1  # was a 52-line (ENOSPC) or 12-line (EROFS) traceback
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot write the report of run r" in lines[0] and "run this again" in lines[0]
