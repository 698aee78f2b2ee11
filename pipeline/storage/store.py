"""The results dataset: one Parquet file per finished shard in a hive-partitioned directory.

Layout: `OUT/run=<run>/target=<t>/draft=<d>/dataset=<ds>/part-<shard>.parquet` (partition
values URI-encoded, so hub ids with '/' stay one directory level). The partition columns live
in the directory names only, the way hive readers expect them: `pandas.read_parquet(OUT)`,
`pyarrow.dataset.dataset(OUT, partitioning="hive")`, DuckDB's and polars' hive readers all
read the dataset. A shard is written under a dot-prefixed temporary name, flushed to disk and
renamed (the folder flushed after): readers (which skip dot files) never see half a file, and
after a crash a file that exists is complete. Only files in this layout are read, and a file
whose Parquet footer cannot be read (truncated by a dying disk, or dropped there by hand) is
skipped and named (`unreadable_files`) rather than ending every read: a run moves it aside
(`quarantine_unreadable`) and computes its rows again. A folder's small files may be merged into
one (`pipeline.storage.compaction`); the files a compaction journal says its merged file replaces
are not read once that file is in place, so no row is read twice while the originals go.
"""
from __future__ import annotations

import fnmatch
import json
import os
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator
from urllib.parse import quote, unquote

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.storage.atomic import write_atomically
from pipeline.storage.schema import FILE_SCHEMA, PARTITIONS, SCHEMA

FILES_PER_SCAN = 200
BATCH_ROWS = 65_536  # rows a read with a reducing step holds before reducing them
TableStep = Callable[[pa.Table], pa.Table]  # one scanned part of a read, reduced
HIVE = ds.partitioning(pa.schema([(name, pa.string()) for name in PARTITIONS]), flavor="hive")
# a compaction's journal in a partition folder, `.compaction-<id>.json`: {"merged": name, "sources": [names]}
JOURNAL_PREFIX = ".compaction-"
JOURNALS = f"{JOURNAL_PREFIX}*.json"  # the names journals have, as a glob


def rows_to_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def run_dir(out: str | Path, run: str) -> Path:
    return Path(out) / f"run={quote(run, safe='')}"


def report_dir(out: str | Path, run: str) -> Path:
    """`OUT/_report-<run>`, the run's name quoted as in `run=<run>` (it never leaves OUT)."""
    return Path(out) / f"_report-{quote(run, safe='')}"


def export_dir(out: str | Path, run: str, fmt: str) -> Path:
    """`OUT/_export-<run>/<format>`, quoted like `report_dir` (underscore: pandas and pyarrow skip it)."""
    return Path(out) / f"_export-{quote(run, safe='')}" / fmt


def run_names(out: str | Path) -> list[str]:
    """The runs under OUT (their `run=<name>` folders)."""
    return sorted(unquote(p.name.removeprefix("run=")) for p in Path(out).glob("run=*") if p.is_dir())


def shard_path(out: str | Path, run: str, target: str, draft: str, dataset: str, shard: str) -> Path:
    parts = [f"{name}={quote(value, safe='')}"
             for name, value in zip(PARTITIONS[1:], (target, draft, dataset))]
    return run_dir(out, run).joinpath(*parts, f"part-{shard}.parquet")


def write_shard(out: str | Path, table: pa.Table) -> Path:
    """Write rows of one shard and partition atomically (temporary dot file, then rename);
    returns the path. Rows of several drafts (a model group's shard) go through `write_shards`."""
    values = {name: table[name].unique().to_pylist() for name in (*PARTITIONS, "shard")}
    mixed = {name: found for name, found in values.items() if len(found) != 1}
    if mixed:
        raise ValueError(f"one file holds one shard of one partition; these rows differ in {mixed}")
    path = shard_path(out, *(values[name][0] for name in (*PARTITIONS, "shard")))
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(table, path)
    return path


def write_shards(out: str | Path, table: pa.Table) -> list[Path]:
    """A shard's rows, one file per partition (a model group's shard holds rows of each of its
    drafts). Each file is atomic; a run stopped between them keeps the rows written and
    computes the others again on resume (rows are keyed, so none is written twice)."""
    keys = table.select(list(PARTITIONS)).to_pylist()
    parts: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        parts.setdefault(tuple(key.values()), []).append(i)
    return [write_shard(out, table.take(pa.array(rows))) for rows in parts.values()]


def file_table(table: pa.Table) -> pa.Table:
    """Rows as a shard file holds them: every column in its type, but the partition columns,
    which live in the folder names."""
    return table.select(FILE_SCHEMA.names).cast(FILE_SCHEMA)


def _write_atomically(table: pa.Table, path: Path) -> None:
    """A shard file that is never seen half-written (`pipeline.storage.atomic`)."""
    cast = file_table(table)
    write_atomically(path, lambda sink: pq.write_table(cast, sink))


def partition_folders(out: str | Path, run: str | None = None) -> list[Path]:
    """The `target=*/draft=*/dataset=*` folders of one run (or `run=*/...` of all)."""
    layout = "target=*/draft=*/dataset=*"
    base = Path(out) if run is None else run_dir(out, run)
    pattern = layout if run is not None else f"run=*/{layout}"
    return [p for p in base.glob(pattern) if p.is_dir()] if base.is_dir() else []


def shard_files(out: str | Path, run: str | None = None, folder: Path | None = None) -> list[Path]:
    """The shard files of the layout (`run=*/target=*/draft=*/dataset=*/part-*.parquet`), of one
    run or all, or of one of its partition folders; a stray file anywhere else is not part of the
    results, nor is a file a compaction has replaced. Each folder is listed once; only a folder
    holding a journal reads more."""
    files, folders = [], partition_folders(out, run) if folder is None else [folder]
    for folder in folders:
        names = os.listdir(folder)
        parts = set(fnmatch.filter(names, "part-*.parquet"))
        for journal in fnmatch.filter(names, JOURNALS):
            parts -= _replaced(folder / journal, parts)
        files += [folder / name for name in parts if (folder / name).is_file()]
    return sorted(files)


def _replaced(journal: Path, listed: set[str]) -> set[str]:
    """The files a compaction journal replaces once its merged file is among the files `listed`
    (the merged file is read instead, though they are unlinked only after); none before that."""
    try:
        entry = json.loads(journal.read_text())
    except FileNotFoundError:  # that compaction finished since the listing: its sources are gone too
        return set()
    return set(entry["sources"]) if entry["merged"] in listed else set()


def footer(path: Path) -> pq.FileMetaData | None:
    """A file's Parquet footer, or None where it cannot be read (truncated, empty, or not Parquet)."""
    try:
        return pq.read_metadata(path)
    except (OSError, pa.ArrowException):
        return None


def _readable(path: Path) -> bool:
    return footer(path) is not None


def unreadable_files(out: str | Path, run: str | None = None) -> list[Path]:
    """Shard files whose Parquet footer cannot be read: every read skips them."""
    return [p for p in shard_files(out, run) if not _readable(p)]


def quarantine_unreadable(out: str | Path, run: str) -> tuple[list[Path], Path]:
    """Move this run's unreadable shard files to `run=<run>/_quarantine/<time>/` (kept for a
    look, out of every read), so a resume computes their rows again. Call it under the run lock."""
    folder = run_dir(out, run) / "_quarantine" / time.strftime("%Y%m%dT%H%M%S")
    moved = []
    for path in unreadable_files(out, run):
        target = folder / path.relative_to(run_dir(out, run))
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        moved.append(target)
    return moved, folder


def _read_files(out: str | Path, files: list[Path], columns: list[str] | None,
                where: ds.Expression | None = None, each: TableStep | None = None) -> pa.Table:
    """The rows of `files`, scanned `FILES_PER_SCAN` at a time: a scan keeps every file's parsed
    footer until it ends, which over a run of tens of thousands of files took gigabytes. Each
    scan's table is made one chunk per column (a chunk per file cost about 80 KB of bookkeeping
    outside Arrow's pool, 0.4 GB per 5,000 files). With `each`, a scan of more than `BATCH_ROWS`
    rows (a compacted run's files) is read, filtered and reduced batch by batch, one file at a
    time, each batch a chunk of its own; a smaller one (a run's own small files) is read whole,
    its files in parallel, then reduced."""
    parts = []
    for start in range(0, len(files), FILES_PER_SCAN):
        dataset = ds.dataset([str(p) for p in files[start:start + FILES_PER_SCAN]], schema=SCHEMA,
                             format="parquet", partitioning=HIVE, partition_base_dir=str(out))
        if each is None:
            parts.append(dataset.to_table(columns=columns, filter=where).combine_chunks())
        elif _rows_in(dataset) <= BATCH_ROWS:  # small files, read in parallel
            parts.append(each(dataset.to_table(columns=columns, filter=where).combine_chunks()))
        else:  # large (compacted) files, reduced batch by batch: never held whole
            batches = dataset.to_batches(columns=columns, filter=where, batch_size=BATCH_ROWS,
                                         batch_readahead=1, fragment_readahead=1)
            parts.extend(each(pa.Table.from_batches([batch])) for batch in batches)
    if not parts:
        empty = SCHEMA.empty_table() if columns is None else SCHEMA.empty_table().select(columns)
        return empty if each is None else each(empty)
    return pa.concat_tables(parts, promote_options="permissive")  # parts `each` made of different types


def _rows_in(dataset: ds.FileSystemDataset) -> int:
    """Rows in the dataset's files, from their footers (which its scan then reuses)."""
    rows = 0
    for fragment in dataset.get_fragments():
        fragment.ensure_complete_metadata()
        rows += fragment.metadata.num_rows
    return rows


def stored_config_keys(out: str | Path, run: str) -> set[str]:
    """The configurations a run holds rows of."""
    return set(read_table(out, run, columns=["config_key"])["config_key"].to_pylist())


def written_rows(out: str | Path, run: str, turns: Iterable[str]) -> Iterator[dict]:
    """Identity and error category of this run's rows of `turns` (what a resume sorts), one
    row at a time: as one list of dicts, ten million rows took 10 GB."""
    table = read_table(out, run,
                       columns=["key", "config_key", "sample_id", "prompt_hash", "turn", "error_category"])
    for batch in table.filter(pc.is_in(table["turn"], pa.array(list(turns), pa.string()))).to_batches(10**5):
        yield from batch.to_pylist()


def drop_rows(out: str | Path, run: str, keys: set[str]) -> int:
    """Remove the rows with these keys from this run's files, each file rewritten atomically
    (removed when nothing is left); returns how many rows went. Call it under the run lock."""
    dropped, doomed = 0, pa.array(sorted(keys), pa.string())
    for path in (p for p in shard_files(out, run) if _readable(p)):
        if not pc.any(pc.is_in(pq.read_table(path, columns=["key"])["key"], doomed)).as_py():
            continue  # only the key column is read from files that keep every row
        table = pq.read_table(path, schema=FILE_SCHEMA)
        kept = table.filter(pc.invert(pc.is_in(table["key"], doomed)))
        dropped += table.num_rows - kept.num_rows
        if kept.num_rows:
            _write_atomically(kept, path)
        else:
            path.unlink()
    return dropped


def read_table(out: str | Path, run: str | None = None, columns: Iterable[str] | None = None,
               where: ds.Expression | None = None, each: TableStep | None = None,
               on_unreadable: Callable[[Path], None] | None = None, folder: Path | None = None) -> pa.Table:
    """Every row under OUT (or of one run) as an Arrow table with the documented schema; only
    `columns`, and only the rows `where` holds for, both pushed into the scan; `each`, where
    given, reduces every scanned part before the parts are joined (so the rows are never held
    whole). The files are read as they are; only when that fails are they listed again (a
    compaction may have replaced some since) and each footer checked, the unreadable ones left
    out, each named to `on_unreadable` (checking them on every read cost as much as a key-column
    read). `folder`: only that partition folder's files (no other file is listed or opened)."""
    columns = None if columns is None else list(columns)
    try:
        return _read_files(out, shard_files(out, run, folder), columns, where, each)
    except (OSError, pa.ArrowException):
        readable = []
        for path in shard_files(out, run, folder):
            if _readable(path):
                readable.append(path)
            elif on_unreadable is not None:
                on_unreadable(path)
        return _read_files(out, readable, columns, where, each)


def read_results(out: str | Path, run: str | None = None) -> pd.DataFrame:
    """The results as a DataFrame, integer columns with nulls (window, gamma) as Python ints
    or None rather than floats."""
    return read_table(out, run).to_pandas(integer_object_nulls=True)


def turn_answers(
    out: str | Path, run: str, *, target: str, dtype: str, dataset: str, turn: str, max_new_tokens: int
) -> dict[str, str]:
    """The target's greedy answer per sample id of `turn` (the turn a later one continues),
    from this run's rows.

    Greedy SD is lossless, so every greedy row of the target (any draft or method) holds the
    same answer; rows with an error are skipped.
    """
    table = read_table(out, run, columns=["target", "dtype", "dataset", "turn", "temperature",
                                          "max_new_tokens", "error", "sample_id", "output_text"])
    mask = pc.and_(
        pc.and_(pc.equal(table["target"], target), pc.equal(table["dtype"], dtype)),
        pc.and_(pc.equal(table["dataset"], dataset), pc.equal(table["turn"], turn)),
    )
    mask = pc.and_(mask, pc.and_(pc.equal(table["temperature"], 0.0),
                                 pc.equal(table["max_new_tokens"], max_new_tokens)))
    mask = pc.and_(mask, pc.is_null(table["error"]))
    rows = table.filter(mask).select(["sample_id", "output_text"]).to_pylist()
    return {row["sample_id"]: row["output_text"] for row in rows}
