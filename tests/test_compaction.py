"""Compaction (`jobs/compact.py`, `pipeline.storage.compaction`) without Ray or models: every row
kept once with its content, fewer files, nothing left to do the second time, a kill at every
file-system step leaving a run that reads and resumes with each key once, the run lock
respected, and a resume afterwards computing nothing."""
from __future__ import annotations

import errno
import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.compact import main
from pipeline.decoding.config import DecodeConfig
from pipeline.planning.grid import Pair, RunConfig, WorkUnit
from pipeline.planning.resume import reconcile, wanted_rows
from pipeline.storage.compaction import compact_run, recover
from pipeline.storage.store import (
    partition_folders, read_table, rows_to_table, run_dir, shard_files, write_shards, written_rows,
)
from tests.results_fixture import RUN, write_results
from tests.test_run_safety import PAIR, ROOT, rows_for, sample

SAMPLES_PER_SHARD = 2

# Runs a script with every os.fsync, os.replace and os.unlink (Path.unlink's too) counted, and
# SIGKILLs itself just before the N-th: argv is N, the script, then the script's arguments.
KILLED_AT = """
import os, runpy, signal, sys
count, die_at = 0, int(sys.argv.pop(1))
def deadly(real):
    def call(*args, **kwargs):
        global count
        count += 1
        if count == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return call
for name in ("fsync", "replace", "unlink"):
    setattr(os, name, deadly(getattr(os, name)))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def small_run(out: Path, shards: int, drafts: tuple[str, ...] = ("tiny:draft",),
              text: int = 0) -> list[WorkUnit]:
    """Run "r": `shards` shards of a model group, each with rows of every draft (`write_shards`
    gives each draft's rows a file in its own folder), answers of `text` random characters if
    given (rows whose data outweighs a file's footer); returns the grid's work units."""
    units = [WorkUnit(RunConfig(Pair(PAIR.target, draft), DecodeConfig("M")), "toy", "first")
             for draft in drafts]
    rng = random.Random(0)
    for i in range(shards):
        samples = [sample(SAMPLES_PER_SHARD * i + j) for j in range(SAMPLES_PER_SHARD)]
        rows = [row for unit in units for row in rows_for(unit.config, samples, f"s{i}")]
        for row in rows if text else ():
            row["output_text"] = rng.randbytes(text // 2).hex()
        write_shards(out, rows_to_table(rows))
    return units


def rows(out: Path, run: str) -> pa.Table:
    """Every row as readers see it, sorted by key, after checking that no key is there twice."""
    table = read_table(out, run)
    assert len(set(table["key"].to_pylist())) == table.num_rows, "a key is read twice"
    return table.sort_by("key")


def folder_names(out: Path, run: str) -> set[str]:
    """Every file in the run's partition folders, dot files too."""
    return {name for folder in partition_folders(out, run) for name in os.listdir(folder)}


def test_every_row_is_kept_once_as_it_was_and_a_second_compaction_changes_nothing(tmp_path):
    write_results(tmp_path)
    before, files = rows(tmp_path, RUN), shard_files(tmp_path, RUN)
    done = compact_run(tmp_path, RUN)
    assert rows(tmp_path, RUN).equals(before)  # every column of every row, partition columns too
    assert (done.files_before, done.files_after, done.rows) == (len(files), 6, before.num_rows)  # 1 a folder
    compacted = shard_files(tmp_path, RUN)
    assert all(p.name.startswith("part-compacted-") and p.suffix == ".parquet" for p in compacted)
    assert {p.parent for p in compacted} == {p.parent for p in files}
    assert all(name.startswith("part-") for name in folder_names(tmp_path, RUN))  # no journal, no temporary
    stamps = {p: p.stat().st_mtime_ns for p in compacted}
    again = compact_run(tmp_path, RUN)
    assert again.files_before == again.files_after == 6 and again.bytes_before == again.bytes_after
    assert {p: p.stat().st_mtime_ns for p in shard_files(tmp_path, RUN)} == stamps


def test_a_folder_past_the_target_becomes_files_that_reach_it_and_those_stay(tmp_path):
    small_run(tmp_path, shards=6, text=20_000)  # files of about 50 kB
    before, files = rows(tmp_path, "r"), shard_files(tmp_path, "r")
    assert compact_run(tmp_path, "r", target_bytes=min(p.stat().st_size for p in files)).files_after == 6
    done = compact_run(tmp_path, "r", target_bytes=100_000)  # three files' rows reach it, two do not
    assert (done.files_before, done.files_after) == (6, 2)
    assert rows(tmp_path, "r").equals(before)
    merged = shard_files(tmp_path, "r")
    assert all(100_000 <= p.stat().st_size < 200_000 for p in merged)
    assert compact_run(tmp_path, "r", target_bytes=100_000).files_after == 2
    assert shard_files(tmp_path, "r") == merged


def test_a_kill_at_any_step_leaves_every_key_read_once_and_the_next_compaction_finishes(tmp_path):
    """Kill `jobs/compact.py` before each of its file-system steps in turn (the run lock's too),
    until it runs through: readers see every row once straight after the kill, before anything
    recovers, then `recover` (as a run starts) and a compaction leave one file a folder."""
    clean = tmp_path / "clean"
    small_run(clean, shards=2, drafts=("tiny:draft", "tiny:draft2"))
    before = rows(clean, "r")
    step = 0
    while True:
        step += 1
        out = tmp_path / f"killed-{step}"
        subprocess.run(["cp", "-a", str(clean), str(out)], check=True)
        job = subprocess.run([sys.executable, "-c", KILLED_AT, str(step), str(ROOT / "jobs" / "compact.py"),
                              str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
        if job.returncode == 0:
            break
        assert job.returncode == -signal.SIGKILL, job.stderr
        assert rows(out, "r").equals(before), f"killed before step {step}"
        assert {r["key"] for r in written_rows(out, "r", ["first"])} == set(before["key"].to_pylist())
        recover(out, "r")
        assert rows(out, "r").equals(before), f"recovered after a kill before step {step}"
        assert all(name.startswith("part-") for name in folder_names(out, "r"))  # no journal, no temporary
        assert compact_run(out, "r").files_after == 2
        assert rows(out, "r").equals(before)
    assert step > 20  # every step of both folders was a kill point (lock, journal, merge, unlinks)
    assert rows(out, "r").equals(before) and len(shard_files(out, "r")) == 2


def test_compaction_is_refused_while_another_driver_holds_the_run(tmp_path, capsys):
    small_run(tmp_path, shards=3)
    names = folder_names(tmp_path, "r")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a live driver
    (run_dir(tmp_path, "r") / ".lock").write_text(
        json.dumps({"host": socket.gethostname(), "pid": other.pid, "since": "earlier"}))
    try:
        assert main([str(tmp_path)]) == 1
    finally:
        other.kill()
        other.wait()
    err = capsys.readouterr().err
    assert err.startswith(f"not compacted: run 'r' in {tmp_path} is being written by pid {other.pid}")
    assert folder_names(tmp_path, "r") == names
    assert main([str(tmp_path)]) == 0  # its driver is gone now
    assert "run r: 3 files -> 1, 6 rows" in capsys.readouterr().out


def test_a_resume_after_compaction_computes_nothing_and_writes_beside_it(tmp_path):
    units = small_run(tmp_path, shards=3, drafts=("tiny:draft", "tiny:draft2"))
    written = sorted(written_rows(tmp_path, "r", ["first"]), key=lambda row: row["key"])
    compact_run(tmp_path, "r")
    assert sorted(written_rows(tmp_path, "r", ["first"]), key=lambda row: row["key"]) == written
    samples = [sample(i) for i in range(3 * SAMPLES_PER_SHARD)]
    resume = reconcile(written_rows(tmp_path, "r", ["first"]), wanted_rows(units, lambda unit: samples))
    assert resume.keep == {row["key"] for row in written} and not resume.recompute
    # a shard a later, larger grid writes lands beside the compacted file and is read with it
    more = [row for unit in units for row in rows_for(unit.config, [sample(99)], "0123456789abcdef")]
    write_shards(tmp_path, rows_to_table(more))
    assert rows(tmp_path, "r").num_rows == len(written) + len(more)


def test_unreadable_files_are_left_as_they_are_and_named(tmp_path, capsys):
    small_run(tmp_path, shards=3)
    folder = shard_files(tmp_path, "r")[0].parent
    broken = folder / "part-broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    assert main([str(tmp_path), "--run", "r"]) == 0
    captured = capsys.readouterr()
    assert f"left as it is: {broken} is not a readable Parquet file" in captured.err
    assert "run r: 4 files -> 2, 6 rows" in captured.out
    assert broken.read_bytes() == b"PAR1 not really"


def test_unknown_runs_and_empty_folders_end_in_one_line(tmp_path, capsys):
    small_run(tmp_path, shards=1)
    assert main([str(tmp_path), "--run", "R"]) == 1
    assert capsys.readouterr().err == f"unknown run 'R' in {tmp_path} (did you mean 'r'?); runs there: r\n"
    assert main([str(tmp_path / "nothing")]) == 1
    assert capsys.readouterr().err == f"no runs under {tmp_path / 'nothing'}\n"
    assert not (tmp_path / "nothing").exists() and not (run_dir(tmp_path, "R")).exists()


@pytest.mark.parametrize("merged", [True, False])
def test_readers_follow_a_journal_only_once_its_merged_file_is_there(tmp_path, merged):
    """The two states a kill can leave between the journal and the unlinks, built by hand."""
    small_run(tmp_path, shards=2)
    before, sources = rows(tmp_path, "r"), shard_files(tmp_path, "r")
    folder = sources[0].parent
    copy = folder / ("part-compacted-x.parquet" if merged else ".part-compacted-x.parquet.1.ab.tmp")
    pq.write_table(pa.concat_tables([pq.read_table(p) for p in sources]), copy)
    (folder / ".compaction-x.json").write_text(
        json.dumps({"merged": "part-compacted-x.parquet", "sources": [p.name for p in sources]}))
    assert rows(tmp_path, "r").equals(before)
    assert shard_files(tmp_path, "r") == ([copy] if merged else sources)
    assert recover(tmp_path, "r") == 1
    left = ["part-compacted-x.parquet"] if merged else [p.name for p in sources]
    assert sorted(os.listdir(folder)) == left
    assert rows(tmp_path, "r").equals(before)


def test_the_job_compacts_a_finished_run_and_a_full_disk_leaves_it_as_it_was(tmp_path, monkeypatch):
    """`jobs/full_grid.py` compacts a run once its grid has finished (`compact_unless_full`); a
    disk too full for the merged file ends in one line and leaves every row once, and the job
    goes on to its report."""
    import pipeline.storage.compaction as compaction

    small_run(tmp_path, shards=4)
    before = rows(tmp_path, "r")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(compaction, "fill", full)
        done, line = compaction.compact_unless_full(tmp_path, "r")
    assert done is None and "run r not compacted: no space left on the disk" in line
    assert "jobs/compact.py" in line and "\n" not in line
    assert len(shard_files(tmp_path, "r")) == 4 and rows(tmp_path, "r").equals(before)

    done, line = compaction.compact_unless_full(tmp_path, "r")
    assert done.files_after == 1 and line.startswith("compacted run r: 4 files -> 1, 8 rows")
    assert len(shard_files(tmp_path, "r")) == 1 and rows(tmp_path, "r").equals(before)
