"""The rows a report reads, and only the columns it reads: a paper-scale run holds millions of
rows, and what makes a row heavy is what no table needs. The output's text and the reference
answer are never read; each block's ensemble weights, the largest column by far, are read for
the few rows the weights figure draws (`with_columns`, the keys pushed into the scan). The output
ids are reduced as each part of the run is scanned, to what the report asks of them: whether two
outputs are the same (`output_digest`) and how long one is (`output_length`); the audit reads the
ids of the few rows that differ to say where. List columns whose values repeat across rows (a
configuration's tree shapes, a sample's image notes) hold one Python object per distinct value;
the per-block lists of each row's own (accepted counts, a bandit's chosen shapes) stay Arrow lists
of the narrowest integer type, read through `pooling.list_lengths` and `flat_values`.
Arrow frees each column as pandas takes it over, so the two copies of the rows need not coexist.
"""
from __future__ import annotations

import ctypes
import gc
import hashlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.reports.pooling import frozen
from pipeline.storage.schema import PARTITIONS, SCHEMA
from pipeline.storage.store import read_table

NOT_READ = ("output_text", "answer")  # no table or figure shows them (the exports do)
ON_DEMAND = ("weights_per_block",)  # read for the rows a figure draws, by key
SHARED = ("verify_shapes", "verify_block_shapes", "image_conversions")  # few distinct values per run
DISTINCT = ("key",)  # a string of each row's own, kept as text: codes would only add to it
# per-block lists of each row's own: kept in Arrow (`pooling.list_lengths`, `flat_values`)
BLOCK_LISTS = ("accepted_per_block", "replay_accepted_per_block", "shape_per_block")
REPORT_COLUMNS = tuple(name for name in SCHEMA.names if name not in NOT_READ + ON_DEMAND)


def output_digest(lists: pa.Array) -> pa.Array:
    """One 64-bit number per list (null for a null list): equal lists give equal numbers, and
    different lists the same number with a chance of about 2^-64. Each value is mixed with its
    position (SplitMix64's finalizer), and the mixes' sum with the length, all in numpy; lists of
    lists hash their inner lists first, strings their codes in the column's dictionary."""
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.uint64)
    values = _codes(pc.list_flatten(lists))
    starts = np.cumsum(lengths) - lengths
    positions = np.arange(len(values), dtype=np.uint64) - np.repeat(starts, lengths.astype(np.int64))
    mixed = _mix(_mix(values + GOLDEN) + positions * GOLDEN)
    sums = np.zeros(len(lengths), np.uint64)
    filled = lengths > 0
    if filled.any():
        sums[filled] = np.add.reduceat(mixed, starts[filled].astype(np.int64))
    digest = _mix(sums ^ (lengths * GOLDEN))
    return pa.array(digest, pa.uint64(), mask=pc.is_null(lists).to_numpy(zero_copy_only=False))


def _codes(values: pa.Array) -> np.ndarray:
    """Each value as a uint64 that equals another's only for equal values, in any part of a read
    (nulls one code)."""
    if pa.types.is_list(values.type):
        values = output_digest(values)
    elif pa.types.is_string(values.type):  # each distinct string hashed once, by its bytes
        encoded = values.dictionary_encode()
        hashes = np.array([int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
                           for text in encoded.dictionary.to_pylist()], np.uint64)
        coded = hashes[pc.fill_null(encoded.indices, 0).to_numpy()] if len(hashes) else np.zeros(len(values))
        values = pa.array(coded.astype(np.uint64), mask=pc.is_null(values).to_numpy(zero_copy_only=False))
    return pc.fill_null(values.cast(pa.uint64(), safe=False), np.uint64(2**64 - 1)).to_numpy()


GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment: no value or length mixes to 0


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _reduced(part: pa.Table) -> pa.Table:
    """One scanned part with its output ids replaced by their digest and length."""
    ids = part["output_ids"].combine_chunks()
    part = part.drop_columns(["output_ids"]).append_column("output_digest", output_digest(ids)) \
        .append_column("output_length", pc.list_value_length(ids))
    for name in BLOCK_LISTS:  # parts may differ in type (int8, int16): the join promotes them
        if name in part.column_names:
            part = part.set_column(part.column_names.index(name), name, _narrowest(part[name]))
    for i, field in enumerate(part.schema):  # a part's strings repeat: each held once, by code
        if pa.types.is_string(field.type) and field.name not in DISTINCT:
            part = part.set_column(i, field.name, pc.dictionary_encode(part[field.name]))
    return part


def as_frame(table: pa.Table) -> pd.DataFrame:
    """`table` as the report's DataFrame (integer columns with nulls as Python ints or None, like
    `store.read_results`); `SHARED` list columns as tuples, one object per distinct value;
    strings as categories."""
    return _frame_of([table])


def _frame_of(holder: list[pa.Table]) -> pd.DataFrame:
    """The table `holder` holds as `as_frame` makes it, taken out of the holder and converted a
    column at a time, each column's Arrow memory freed once converted: over a million rows, a
    second copy of every column took half a gigabyte."""
    table = holder.pop()
    columns = {}
    while table.num_columns:
        name, column = table.column_names[0], table.column(0)
        table = table.remove_column(0)
        if name in SHARED:
            columns[name] = _interned(column)
        elif name in BLOCK_LISTS:
            columns[name] = pd.arrays.ArrowExtensionArray(column)
        elif name not in DISTINCT and _is_text(column.type):
            columns[name] = _categorical(column)
        else:
            columns[name] = column.to_pandas(integer_object_nulls=True)
        del column
        pa.default_memory_pool().release_unused()  # the converted column's pages, back to the system
    return pd.DataFrame(columns, copy=False)


def _narrowest(lists: pa.ChunkedArray) -> pa.ChunkedArray:
    """Integer lists with their values in the narrowest integer type that holds them all: a
    block's accepted count or chosen shape fits a byte, and as Python lists the two columns took
    430 of a row's 830 bytes."""
    extremes = pc.min_max(pc.list_flatten(lists)).as_py()
    for kind in (pa.int8(), pa.int16(), pa.int32()):
        if extremes["min"] is None or np.iinfo(kind.to_pandas_dtype()).min <= extremes["min"] \
                and extremes["max"] <= np.iinfo(kind.to_pandas_dtype()).max:
            return lists.cast(pa.list_(kind))
    return lists


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_dictionary(kind)  # coded as read: `_reduced`


def _categorical(column: pa.ChunkedArray) -> pd.Categorical:
    """A string column as pandas categories in text order: a run's strings repeat (a
    configuration's fields, a sample's id), and each row then holds a small code, not its text;
    in text order, sorting and grouping read as they would over the strings."""
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    categories = pa.chunked_array([chunk.dictionary for chunk in column.chunks], pa.string())
    categories = pc.unique(categories).drop_null()
    categories = categories.take(pc.sort_indices(categories))
    width = np.int8 if len(categories) < 2**7 else np.int16 if len(categories) < 2**15 else np.int32
    codes = np.concatenate([_recoded(chunk, categories).astype(width) for chunk in column.chunks]
                           or [np.empty(0, width)])
    return pd.Categorical.from_codes(codes, categories=pd.Index(categories.to_pylist(), dtype="str"))


def _recoded(chunk: pa.DictionaryArray, categories: pa.Array) -> np.ndarray:
    """The chunk's codes into `categories` (-1 for null)."""
    mapping = pc.index_in(chunk.dictionary, value_set=categories).to_numpy(zero_copy_only=False)
    codes = mapping[pc.fill_null(chunk.indices, 0).to_numpy()] if len(mapping) else np.zeros(len(chunk), int)
    return np.where(chunk.is_null().to_numpy(zero_copy_only=False), -1, codes)


def _interned(column: pa.ChunkedArray) -> np.ndarray:
    """The column's values as nested tuples of Python values (None for null), equal values one
    object: only one row of each distinct value (by `output_digest`) is turned into Python."""
    seen: dict[int, tuple] = {}
    made, start = np.empty(len(column), dtype=object), 0
    for chunk in column.chunks:
        digests = output_digest(chunk)
        present = pc.is_valid(digests).to_numpy(zero_copy_only=False)
        filled = pc.fill_null(digests, np.uint64(0)).to_numpy()  # with nulls, numpy would get floats
        unique, first, inverse = np.unique(filled[present], return_index=True, return_inverse=True)
        rows = np.flatnonzero(present)
        for digest, value in zip(unique.tolist(), chunk.take(rows[first]).to_pylist()):
            seen.setdefault(digest, frozen(value))
        values = np.empty(len(unique), dtype=object)
        for i, digest in enumerate(unique.tolist()):  # one by one: numpy would unpack tuples given at once
            values[i] = seen[digest]
        made[start + rows] = values[inverse]
        start += len(chunk)
    return made


def read_report_rows(out: str | Path, run: str | None = None, where: pc.Expression | None = None,
                     on_unreadable: Callable[[Path], None] | None = None,
                     folder: Path | None = None) -> pd.DataFrame:
    """Every row of the run (or of every run under OUT), or of one of its partition folders,
    with the columns the report reads, the output ids read as `output_digest` and
    `output_length`; only the rows `where` holds for (filtered in the scan), when given. Files
    that cannot be read are left out, each named to `on_unreadable`."""
    with _jemalloc():
        holder = [read_table(out, run, columns=REPORT_COLUMNS, where=where, each=_reduced,
                             on_unreadable=on_unreadable, folder=folder)]
        return _frame_of(holder)  # the frame takes the table over, and the table is held nowhere else


def release_memory() -> None:
    """Hand the heap pages freed since back to the system: Arrow's pool's, and glibc's (which
    keeps freed pages of many small allocations, a column's Python objects, until told), so
    what one partition folder's rows took is not still held while the next is read."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator decides
        pass


@contextmanager
def _jemalloc() -> Iterator[None]:
    """Arrow allocating from jemalloc while the rows are read, its freed pages handed back as
    each column is converted (`_frame_of`): with Arrow's default (mimalloc) the scan's
    short-lived batch buffers, freed between the parts kept, left memory that was never handed
    back and grew with the run (a 3.5 GB read at three million rows; 2.7 GB with jemalloc)."""
    previous = pa.default_memory_pool()
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without it (Windows): the default pool reads alike
        pass
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


def with_columns(out: str | Path, run: str, rows: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """`rows` with `columns` added, read from the run's files for these rows' keys only; rows
    that already hold them (a caller that read everything) are returned as they are."""
    missing = [c for c in columns if c not in rows.columns]
    if not missing or rows.empty:
        return rows.assign(**{c: None for c in missing}) if missing else rows
    where = pc.field("key").isin(pa.array(rows["key"].astype(str).tolist(), pa.string()))
    for name in PARTITIONS[1:]:  # files of other partitions are skipped by their folder names, unopened
        where &= pc.field(name).isin(pa.array(rows[name].astype(str).unique().tolist(), pa.string()))
    read = read_table(out, run, columns=["key", *missing], where=where,
                      each=lambda part: part)  # a compacted run's files streamed, never held whole
    by_key = as_frame(read).set_index("key")
    return rows.assign(**{c: rows["key"].map(by_key[c]) for c in missing})
