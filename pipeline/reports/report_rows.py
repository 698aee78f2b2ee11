"""The rows a report reads, and only the columns it reads: a paper-scale run holds millions of
rows, and what makes a row heavy is what no table needs. The output's text and the reference
answer are never read; each block's ensemble weights, the largest column by far, are read for
the few rows the weights figure draws (`with_columns`, the keys pushed into the scan). Arrow
frees each column as pandas takes it over, so the two copies of the rows need not coexist.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.storage.schema import PARTITIONS, SCHEMA
from pipeline.storage.store import read_table

NOT_READ = ("output_text", "answer")  # no table or figure shows them (the exports do)
ON_DEMAND = ("weights_per_block",)  # read for the rows a figure draws, by key
REPORT_COLUMNS = tuple(name for name in SCHEMA.names if name not in NOT_READ + ON_DEMAND)


def as_frame(table: pa.Table) -> pd.DataFrame:
    """`table` as the report's DataFrame (integer columns with nulls as Python ints or None, like
    `store.read_results`), freeing each Arrow column once converted."""
    return table.to_pandas(integer_object_nulls=True, self_destruct=True, split_blocks=True)


def read_report_rows(out: str | Path, run: str | None = None,
                     where: pc.Expression | None = None) -> pd.DataFrame:
    """Every row of the run (or of every run under OUT) with the columns the report reads; only
    the rows `where` holds for (e.g. one target: filtered in the scan), when given."""
    return as_frame(read_table(out, run, columns=REPORT_COLUMNS, where=where))


def with_columns(out: str | Path, run: str, rows: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """`rows` with `columns` added, read from the run's files for these rows' keys only; rows
    that already hold them (a caller that read everything) are returned as they are."""
    missing = [c for c in columns if c not in rows.columns]
    if not missing or rows.empty:
        return rows.assign(**{c: None for c in missing}) if missing else rows
    where = pc.field("key").isin(pa.array(rows["key"].astype(str).tolist(), pa.string()))
    for name in PARTITIONS[1:]:  # files of other partitions are skipped by their folder names, unopened
        where &= pc.field(name).isin(pa.array(rows[name].astype(str).unique().tolist(), pa.string()))
    read = read_table(out, run, columns=["key", *missing], where=where)
    by_key = as_frame(read).set_index("key")
    return rows.assign(**{c: rows["key"].map(by_key[c]) for c in missing})
