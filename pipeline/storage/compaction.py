"""Merge a finished run's small shard files, folder by folder, into files of about a target size:
a paper-scale run writes tens of thousands of files of a few kB, which are slow to list, read,
copy and archive. Rows, their keys and content stay as they are, so readers and a resume (keyed
on rows, not files) see the same run.

A merged file is named `part-compacted-<id>.parquet`: it matches the layout's `part-*.parquet`,
and never a shard a later resume writes (`part-<shard>.parquet`, a shard id being 16 hex digits).

A kill at any instant leaves every row read exactly once. Each group of files is replaced in
steps: (1) the merged file is written to a temporary dot file and flushed; (2) a journal
`.compaction-<id>.json` naming the merged file and the files it replaces is written atomically;
(3) the merged file is renamed into place; (4) the replaced files are unlinked and the folder
flushed; (5) the journal is unlinked. Readers (`store.shard_files`) skip dot files and the
replaced files of a journal whose merged file is there: before (3) they read the old files,
after it the merged one. `recover` settles what a killed compaction left: a journal with its
merged file is finished (steps 4 and 5), one without is dropped, and the temporaries go. It runs
before every compaction and when a run starts (`actors.runner`), under the run lock. Other tools
reading the folders directly (pandas, DuckDB) do not read journals: during a compaction, or after
a killed one until `recover` runs, they can see a folder's rows twice.
"""
from __future__ import annotations

import fnmatch
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.storage.atomic import UNWRITABLE, fill, fsync_folder, temporary, write_atomically
from pipeline.storage.run_lock import run_lock
from pipeline.storage.schema import FILE_SCHEMA
from pipeline.storage.store import (
    JOURNAL_PREFIX, JOURNALS, file_table, footer, partition_folders, shard_files,
)

TARGET_BYTES = 128 * 10**6
MERGED_PREFIX = "part-compacted-"
FILES_PER_READ = 200
# what `atomic.temporary` leaves when a merged file or a journal is being written at a kill
TEMPORARIES = (f".{MERGED_PREFIX}*.tmp", f".{JOURNAL_PREFIX}*.tmp")


@dataclass
class Compaction:
    """What `compact_run` did to a run (bytes: the files' sizes on disk)."""

    files_before: int = 0
    files_after: int = 0
    rows: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0
    recovered: int = 0  # journals of an earlier, killed compaction settled first
    unreadable: list[Path] = field(default_factory=list)  # left as they are

    def summary(self, run: str) -> str:
        return (f"compacted run {run}: {self.files_before} files -> {self.files_after}, {self.rows} rows, "
                f"{self.bytes_before / 1e6:.1f} MB -> {self.bytes_after / 1e6:.1f} MB, {self.seconds:.1f} s")


def compact_run(out: str | Path, run: str, target_bytes: int = TARGET_BYTES) -> Compaction:
    """Merge the run's files under `target_bytes`, each folder's in order of name, into files that
    reach it, while two or more are left: the last may stay smaller, so a second compaction finds
    at most one file a folder to merge and leaves it. Holds the run's lock (`RunLocked` while
    another driver holds it: a driver dropping rows from a file already read for merging would
    see its change undone). Unreadable files are left as they are and listed."""
    start = time.monotonic()
    with run_lock(out, run):
        done = Compaction(recovered=recover(out, run))
        files = shard_files(out, run)
        done.files_before, done.bytes_before = len(files), sum(p.stat().st_size for p in files)
        small: dict[Path, list[Path]] = {}
        for path in files:
            meta = footer(path)
            if meta is None:
                done.unreadable.append(path)
                continue
            done.rows += meta.num_rows
            if path.stat().st_size < target_bytes:
                small.setdefault(path.parent, []).append(path)
        for left in small.values():
            while len(left) > 1:
                left = left[len(_merge(left, target_bytes)):]
        after = shard_files(out, run)
        done.files_after, done.bytes_after = len(after), sum(p.stat().st_size for p in after)
    done.seconds = time.monotonic() - start
    return done


def compact_unless_full(out: str | Path, run: str, target_bytes: int = TARGET_BYTES
                        ) -> tuple[Compaction | None, str]:
    """`compact_run` and its summary line; or, where a full or read-only disk stopped it, None
    and a line saying so: the run is left as it was, every row read once."""
    try:
        done = compact_run(out, run, target_bytes)
    except OSError as err:
        if err.errno not in UNWRITABLE:
            raise
        return None, (f"run {run} not compacted: {UNWRITABLE[err.errno]}: could not write "
                      f"{err.filename or out}; it reads as before (every row once); once the disk can be "
                      f"written, `python jobs/compact.py {out} --run {run}` merges its files")
    return done, done.summary(run)


def _merge(files: list[Path], target_bytes: int) -> list[Path]:
    """Replace the first two or more of one folder's `files` by one file of about the target, in
    the steps of the module's docstring; returns the files replaced."""
    folder, name = files[0].parent, uuid.uuid4().hex[:16]
    merged, journal = folder / f"{MERGED_PREFIX}{name}.parquet", folder / f"{JOURNAL_PREFIX}{name}.json"
    taken: list[Path] = []
    with temporary(merged) as tmp:
        fill(tmp, lambda sink: _copy_rows(sink, files, target_bytes, taken))
        entry = {"merged": merged.name, "sources": [p.name for p in taken]}
        write_atomically(journal, lambda sink: sink.write(json.dumps(entry).encode()))
        try:
            os.replace(tmp, merged)
            fsync_folder(folder)
        finally:  # finished, or undone where the rename never happened
            _settle(journal)
    return taken


def _copy_rows(sink: BinaryIO, files: list[Path], target_bytes: int, taken: list[Path]) -> None:
    """Copy the rows of `files`, in order and a group of files at a time (`_read_groups`), into
    one Parquet file until it reaches the target (two files at least); `taken` gets the files
    copied. Rows are written in row groups of about the target's bytes in memory, which compress
    to a part of it: a file overshoots the target by less than a row group and a group, and a
    file that reaches it is left alone the next time."""
    with pq.ParquetWriter(sink, FILE_SCHEMA) as writer:
        buffered: list[pa.Table] = []
        size = 0
        for group in _read_groups(files, target_bytes):
            scan = ds.dataset([str(p) for p in group], schema=FILE_SCHEMA, format="parquet")
            buffered.append(file_table(scan.to_table()))  # the group's files in order, read in parallel
            taken.extend(group)
            size += buffered[-1].nbytes
            if size >= target_bytes:
                writer.write_table(pa.concat_tables(buffered))
                buffered, size = [], 0
                if len(taken) > 1 and sink.tell() >= target_bytes:
                    return
        if buffered:
            writer.write_table(pa.concat_tables(buffered))


def _read_groups(files: list[Path], target_bytes: int) -> Iterator[list[Path]]:
    """`files` in order, in groups read in one scan each: reading a small file is mostly its
    own overhead (a footer and a column chunk per column), which one scan of many spreads over
    threads and casts once. A group holds up to `FILES_PER_READ` files under a sixteenth of the
    target on disk together (a larger file is a group alone), so a merged file still overshoots
    the target by little."""
    group: list[Path] = []
    size = 0
    for path in files:
        file_size = path.stat().st_size
        if group and (len(group) == FILES_PER_READ or size + file_size > target_bytes // 16):
            yield group
            group, size = [], 0
        group.append(path)
        size += file_size
    if group:
        yield group


def _settle(journal: Path) -> None:
    """Finish a journal's compaction if its merged file is in place, else drop the journal (the
    files it names were never touched). The replaced files go and the folder is flushed before the
    journal goes: the other way round, a crash could leave both copies and no journal."""
    folder, entry = journal.parent, json.loads(journal.read_text())
    if (folder / entry["merged"]).exists():
        for name in entry["sources"]:
            (folder / name).unlink(missing_ok=True)
        fsync_folder(folder)
    journal.unlink()


def recover(out: str | Path, run: str) -> int:
    """Settle every journal a killed compaction left in the run and remove its temporaries;
    returns how many journals there were. Call it under the run lock."""
    settled = 0
    for folder in partition_folders(out, run):
        names = os.listdir(folder)
        for temporary_name in (n for pattern in TEMPORARIES for n in fnmatch.filter(names, pattern)):
            (folder / temporary_name).unlink(missing_ok=True)
        for journal in fnmatch.filter(names, JOURNALS):
            _settle(folder / journal)
            settled += 1
    return settled
