"""Pooled tau, the report's one measure of acceptance: 1 + the accepted proposals of every block
of a group of rows over their blocks (docs/algorithm.md §1), long answers weighing more."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

# what pooled tau reads of a row, or of a cell of rows (`pipeline.reports.cells`: `accepted` summed)
BLOCKS = ["accepted_per_block", "accepted", "blocks"]


def pooled_tau(group: pd.DataFrame) -> float:
    """Pooled tau of one group of rows (NaN for a group without blocks)."""
    accepted = int(accepted_sums(group).sum())
    blocks = group["blocks"].sum()
    return float("nan") if blocks == 0 else 1.0 + accepted / blocks


def pooled_taus(rows: pd.DataFrame, keys: list[str], sort: bool = False) -> pd.Series:
    """`pooled_tau` of each group of `rows` by `keys` (in order of appearance, or sorted), from
    each row's sum of accepted proposals: no frame per group, which over a million rows copied
    them all."""
    sums = accepted_sums(rows)
    summed = rows[keys].assign(accepted=sums, blocks=rows["blocks"]).groupby(keys, sort=sort).sum()
    return (1.0 + summed["accepted"] / summed["blocks"]).where(summed["blocks"] != 0)


def accepted_sums(rows: pd.DataFrame) -> np.ndarray:
    """Each row's accepted proposals, or each cell's (`cells.cells_of` sums them)."""
    return rows["accepted"].to_numpy() if "accepted" in rows else row_sums(rows["accepted_per_block"])


def list_lengths(values: pd.Series) -> np.ndarray:
    """Each row's list length (0 for a null, as an error row's blocks), of a list column held as
    Arrow lists (`report_rows`: a per-block list as Python objects took 250 bytes a row) or as
    Python lists (a frame read whole)."""
    if isinstance(values.dtype, pd.ArrowDtype):
        return pc.fill_null(pc.list_value_length(_arrow(values)), 0).to_numpy().astype(np.int64)
    lists = values.tolist()
    return np.fromiter((len(a) if hasattr(a, "__len__") else 0 for a in lists), np.int64, len(lists))


def flat_values(values: pd.Series) -> np.ndarray:
    """Every row's list values one after another (`list_lengths` says whose), in the column's own
    integer type: one array, never a Python list per row."""
    if isinstance(values.dtype, pd.ArrowDtype):
        return np.asarray(pc.list_flatten(_arrow(values)))
    lists = values.tolist()
    filled = [np.asarray(a) for a in lists if hasattr(a, "__len__") and len(a)]
    return np.concatenate(filled) if filled else np.zeros(0, np.int64)


def row_sums(values: pd.Series) -> np.ndarray:
    """Each row's list summed (0 for an empty or null list), as int64."""
    lengths, sums = list_lengths(values), np.zeros(len(values), np.int64)
    filled = lengths > 0
    if filled.any():
        starts = (np.cumsum(lengths) - lengths)[filled]
        sums[filled] = np.add.reduceat(flat_values(values), starts, dtype=np.int64)
    return sums


def frozen(value: object) -> object:
    """A list value (a tree shape, lists within lists) as nested tuples, to hash or group by;
    any other value as it is."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(frozen(v) for v in value)
    return value


def _arrow(values: pd.Series) -> pa.ChunkedArray:
    return pa.chunked_array(values.array.__arrow_array__())


def present(rows: pd.DataFrame, columns: list[str]) -> list[str]:
    """Those of `columns` that `rows` has, once each: what a table copies of the rows it keeps,
    where copying every column of a million rows took gigabytes."""
    return [c for c in dict.fromkeys(columns) if c in rows]
