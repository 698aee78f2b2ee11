"""Pooled tau, the report's one measure of acceptance: 1 + the accepted proposals of every block
of a group of rows over their blocks (docs/algorithm.md §1), long answers weighing more."""
from __future__ import annotations

import numpy as np
import pandas as pd

BLOCKS = ["accepted_per_block", "blocks"]  # what pooled tau reads of a row


def pooled_tau(group: pd.DataFrame) -> float:
    """Pooled tau of one group of rows (NaN for a group without blocks)."""
    lists = group["accepted_per_block"].tolist()
    accepted = int(np.concatenate(lists).sum()) if lists else 0  # one sum, not one per row
    blocks = group["blocks"].sum()
    return float("nan") if blocks == 0 else 1.0 + accepted / blocks


def pooled_taus(rows: pd.DataFrame, keys: list[str], sort: bool = False) -> pd.Series:
    """`pooled_tau` of each group of `rows` by `keys` (in order of appearance, or sorted), from
    each row's sum of accepted proposals: no frame per group, which over a million rows copied
    them all."""
    lists = rows["accepted_per_block"].tolist()
    sums = accepted_sums(lists, block_lengths(lists))
    summed = rows[keys].assign(accepted=sums, blocks=rows["blocks"]).groupby(keys, sort=sort).sum()
    return (1.0 + summed["accepted"] / summed["blocks"]).where(summed["blocks"] != 0)


def block_lengths(lists: list) -> np.ndarray:
    """Each row's number of blocks, from its accepted counts (0 where an error row has none)."""
    return np.fromiter((len(a) if hasattr(a, "__len__") else 0 for a in lists), int, len(lists))


def accepted_sums(lists: list, lengths: np.ndarray) -> np.ndarray:
    """Each row's accepted proposals summed (`lengths`: `block_lengths`), from the flat counts:
    no array per block beside them."""
    sums, filled = np.zeros(len(lists), np.int64), lengths > 0
    if filled.any():
        flat = np.concatenate([lists[i] for i in np.flatnonzero(filled)]).astype(np.int64)
        sums[filled] = np.add.reduceat(flat, np.cumsum(lengths[filled]) - lengths[filled])
    return sums


def present(rows: pd.DataFrame, columns: list[str]) -> list[str]:
    """Those of `columns` that `rows` has, once each: what a table copies of the rows it keeps,
    where copying every column of a million rows took gigabytes."""
    return [c for c in dict.fromkeys(columns) if c in rows]
