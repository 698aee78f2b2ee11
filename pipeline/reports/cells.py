"""A run's rows summed per cell: one line per configuration, pair, dataset, turn and mode (failed
rows apart), holding what the tau tables pool. A paper-scale run has millions of rows but a few
thousand cells, and a cell never spans two partition folders (its target, draft and dataset are
among its keys), so cells are summed one folder at a time and the sums of the folders put side
by side (`concat_frames`) are the run's. The tau tables, the category averages, the findings, the
paper check and the tau figure read cells as they would read rows: a cell holds each key column
as its rows do, and `accepted` and `blocks` where a row holds its per-block list
(`pooling.pooled_taus` sums either).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from pipeline.reports.pooling import flat_values, frozen, list_lengths, row_sums

# Every field a table groups, filters or labels rows by that is one value per configuration,
# sample's dataset and turn: what two rows must share to be summed into one cell.
CELL_KEYS = (
    "run", "target", "draft", "dataset", "dtype", "turn", "category", "config_key", "methods", "method_label",
    "policy", "policy_kind", "measure", "policy_temperature", "window", "distance", "gamma", "verify",
    "verify_kind", "verify_nodes", "verify_top_k", "verify_shapes", "verify_knobs", "verify_block_shapes",
    "temperature", "seed", "max_new_tokens", "captioner", "mode", "engine", "batch",
)


def cell_ids(rows: pd.DataFrame) -> np.ndarray:
    """Each row's cell number, numbered in order of first appearance: equal in every `CELL_KEYS`
    column (nulls equal to nulls) and in whether the row failed."""
    keys = [_hashable(rows[c]) for c in CELL_KEYS if c in rows] + [rows["error"].notna().rename("failed")]
    return rows.groupby(keys, sort=False, dropna=False, observed=True).ngroup().to_numpy()


def _hashable(values: pd.Series) -> pd.Series:
    """`values`, lists (tree shapes of rows read whole or made by hand) as tuples to group by."""
    if values.dtype != object:
        return values
    first = values.dropna().head(1).tolist()
    if not first or not isinstance(first[0], (list, np.ndarray)):
        return values
    return values.map(frozen)


def cells_of(rows: pd.DataFrame, ids: np.ndarray | None = None) -> pd.DataFrame:
    """One line per cell (`cell_ids`, in that order): its first row's key columns and `error`,
    its `rows`, the `accepted` proposals and `blocks` of those that decoded, and `shape_counts`
    (blocks per shape of a bandit's `verify_shapes`, a tuple; None where no row of the cell
    recorded one: `speedup.shapes_used`)."""
    ids = cell_ids(rows) if ids is None else ids
    count = int(ids.max()) + 1 if len(ids) else 0
    first = np.unique(ids, return_index=True)[1]
    cells = rows.iloc[first][[c for c in CELL_KEYS if c in rows] + ["error"]].reset_index(drop=True)
    decoded = rows["error"].isna().to_numpy()
    blocks = (rows["blocks"].astype("float64").fillna(0).to_numpy() if "blocks" in rows  # int32, or objects
              else list_lengths(rows["accepted_per_block"]))
    cells["rows"] = np.bincount(ids, minlength=count)
    cells["accepted"] = _summed(ids[decoded], row_sums(rows["accepted_per_block"])[decoded], count)
    cells["blocks"] = _summed(ids[decoded], blocks[decoded], count)
    cells["shape_counts"] = _shape_counts(rows, ids, decoded, count)
    return cells


def _summed(ids: np.ndarray, values: np.ndarray, count: int) -> np.ndarray:
    return np.bincount(ids, weights=values, minlength=count).round().astype(np.int64)  # exact below 2^53


def _shape_counts(rows: pd.DataFrame, ids: np.ndarray, decoded: np.ndarray, count: int) -> list:
    """Per cell, how many blocks used each shape, as a tuple (None where none was recorded)."""
    counts: list = [None] * count
    if "shape_per_block" not in rows:
        return counts
    lengths = list_lengths(rows["shape_per_block"]) * decoded
    if not lengths.any():
        return counts
    arms = flat_values(rows["shape_per_block"]).astype(np.int64)
    kept = np.repeat(decoded, list_lengths(rows["shape_per_block"]))
    owner, arms = np.repeat(ids, lengths), arms[kept]
    width = int(arms.max()) + 1
    table = np.bincount(owner * width + arms, minlength=count * width).reshape(count, width)
    for cell in np.unique(owner):
        counts[cell] = tuple(int(n) for n in table[cell])
    return counts


def concat_frames(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Frames of several folders (cells, or rows) one after another, in the order given; a
    column of categories in every frame stays one, over the union of their categories in text
    order as the rows' are (`report_rows`)."""
    frames = [frame for frame in frames if len(frame)] or frames[:1]
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    joined = pd.concat(frames, ignore_index=True)
    for name in joined.columns:
        values = [frame[name] for frame in frames if name in frame]
        if len(values) == len(frames) and all(isinstance(v.dtype, pd.CategoricalDtype) for v in values):
            joined[name] = union_categoricals([v.array for v in values], sort_categories=True)
    return joined
