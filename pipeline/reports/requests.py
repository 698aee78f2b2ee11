"""What the acceptance tables and the tau figure read of each row that decoded, one line per row
and none of its lists: its cell (`pipeline.reports.cells`, which holds its configuration), its
sample, its prompt's length and images, its accepted drafts, blocks and drafted positions, and
how many of its blocks reached and accepted each draft position (`position_matrix`). Per-block
lists are read one partition folder at a time and reduced to these counts; a paper-scale run's
tens of millions of blocks are never held at once, and each table is computed from the counts
as it was from the lists (the same values in the same order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.reports.cells import cell_ids, cells_of, concat_frames
from pipeline.reports.pooling import flat_values, list_lengths

# what a row keeps besides its counts, where the rows have it
KEPT = ["sample_id", "prompt_tokens", "images"]


def _depths(rows: pd.DataFrame, lengths: np.ndarray) -> np.ndarray:
    """Drafted positions of every block of `rows`, flattened: the row's gamma, or where a bandit
    recorded its chosen shape per block (`shape_per_block`, one pick per block), that shape's
    depth. Looked up per distinct `verify_shapes` value, never per row."""
    gammas = pd.to_numeric(rows["gamma"], errors="coerce").fillna(0).to_numpy(np.int64) * (lengths > 0)
    depths = np.repeat(gammas, lengths).astype(np.int16)
    if "verify_shapes" not in rows or "shape_per_block" not in rows:
        return depths
    picks = list_lengths(rows["shape_per_block"])
    shapes = rows["verify_shapes"].to_numpy(dtype=object)
    recorded = (picks == lengths) & (lengths > 0) & np.fromiter(
        (hasattr(value, "__len__") and len(value) > 0 for value in shapes), bool, len(shapes))
    if not recorded.any():
        return depths
    # rows read by the report share one object per distinct value: one table per object
    table_of, _ = pd.factorize(np.fromiter(map(id, shapes[recorded]), np.int64, int(recorded.sum())))
    first = np.flatnonzero(recorded)[np.unique(table_of, return_index=True)[1]]
    tables = [[len(shape) for shape in shapes[i]] for i in first]
    padded = np.zeros((len(tables), max(map(len, tables))), np.int16)
    for i, table in enumerate(tables):
        padded[i, :len(table)] = table
    arms = flat_values(rows["shape_per_block"]).astype(np.int64)[np.repeat(recorded, picks)]
    depths[np.repeat(recorded, lengths)] = padded[np.repeat(table_of, lengths[recorded]), arms]
    return depths


def blocks_of(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every block of `rows`, flattened: (its row's position in `rows`, accepted drafts, drafted
    positions, whether it is its row's last block). Arrays in narrow types, not a loop per
    block: a paper-scale run has hundreds of millions of blocks (`requests_of` counts them a
    slice of rows at a time)."""
    lengths = list_lengths(rows["accepted_per_block"])
    ends = np.cumsum(lengths)
    last = np.zeros(int(ends[-1]) if len(ends) else 0, bool)
    last[ends[lengths > 0] - 1] = True
    accepted = flat_values(rows["accepted_per_block"]).astype(np.int16)
    return np.repeat(np.arange(len(rows), dtype=np.int32), lengths), accepted, _depths(rows, lengths), last


def position_matrix(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(reached, accepted): rows x draft positions 1..deepest, for every row at once. A block
    reaches position k when it accepted the k - 1 before it and drafted at least k; a row's last
    block is censored after its accepted count."""
    reached, hits = _positions(blocks_of(rows), len(rows))
    return reached, hits


def _positions(blocks: tuple, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`position_matrix` of `count` rows from their `blocks_of`."""
    row, accepted, depth, last = blocks
    deepest = int(depth.max()) if len(depth) else 0
    seen = np.where(last, accepted, np.minimum(accepted + 1, depth))

    def at_least(values: np.ndarray) -> np.ndarray:  # [row, k]: blocks of the row with value > k
        cells = row.astype(np.int64) * (deepest + 1) + np.clip(values, 0, deepest)
        counts = np.bincount(cells, minlength=count * (deepest + 1)).reshape(count, deepest + 1)
        return counts[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]

    return at_least(seen), at_least(accepted)


@dataclass
class Requests:
    """`rows`: one line per decoded row, with `cell` (a line of `cells`), `KEPT`,
    `accepted`, `blocks`, `drafted`, `deepest` (its blocks' deepest drafted position) and
    `counted` (speculative with blocks: what the acceptance tables count); `reached` and `hits`:
    the counted rows' `position_matrix`, in their order."""

    cells: pd.DataFrame
    rows: pd.DataFrame
    reached: np.ndarray
    hits: np.ndarray

    def within(self, cells: pd.DataFrame) -> "Requests":
        """Only the rows of these cells (a subset of `self.cells`, by index)."""
        keep = np.isin(self.rows["cell"].to_numpy(), cells.index.to_numpy())
        counted = keep[self.rows["counted"].to_numpy()]
        return Requests(cells, self.rows[keep], self.reached[counted], self.hits[counted])

    def spread(self, column: str, cell: np.ndarray) -> pd.Series:
        """A cell column given per row, by cell number (categories stay codes)."""
        values, cell = self.cells[column], self.cells.index.get_indexer(cell)
        if isinstance(values.dtype, pd.CategoricalDtype):
            codes = values.cat.codes.to_numpy()[cell]
            return pd.Series(pd.Categorical.from_codes(codes, dtype=values.dtype))
        return pd.Series(values.to_numpy()[cell])


ROWS_AT_ONCE = 200_000  # rows whose blocks are flattened at once: about 4 million blocks, 100 MB


def requests_of(rows: pd.DataFrame, ids: np.ndarray, cells: pd.DataFrame) -> Requests:
    """The `Requests` of `rows`, whose cells are `ids` (numbers of lines of `cells`); their
    blocks counted `ROWS_AT_ONCE` rows at a time."""
    decoded = rows["error"].isna().to_numpy()
    counted = decoded & rows["gamma"].notna().to_numpy() & (list_lengths(rows["accepted_per_block"]) > 0)
    kept = rows.loc[decoded, [c for c in KEPT if c in rows]].reset_index(drop=True)
    read = [rows.columns.get_loc(c) for c in ("gamma", "accepted_per_block", "verify_shapes",
                                              "shape_per_block") if c in rows]
    sums = {name: np.zeros(len(kept), np.int32) for name in ("accepted", "blocks", "drafted", "deepest")}
    reached, hits = [], []
    sources, lines = np.flatnonzero(counted), np.flatnonzero(counted[decoded])
    for start in range(0, len(sources), ROWS_AT_ONCE):
        chunk = rows.iloc[sources[start:start + ROWS_AT_ONCE], read]
        blocks = blocks_of(chunk)
        row, accepted, depth, _ = blocks
        line = lines[start:start + ROWS_AT_ONCE]
        sums["accepted"][line] = np.bincount(row, weights=accepted, minlength=len(chunk)).round()
        sums["blocks"][line] = np.bincount(row, minlength=len(chunk))
        sums["drafted"][line] = np.bincount(row, weights=depth, minlength=len(chunk)).round()
        sums["deepest"][line] = np.maximum.reduceat(depth, np.flatnonzero(np.diff(row, prepend=-1)))
        for matrices, counts in zip((reached, hits), _positions(blocks, len(chunk))):
            matrices.append(_narrow(counts))
    kept = kept.assign(cell=ids[decoded].astype(np.int32), **sums, counted=counted[decoded])
    return Requests(cells, kept, _stacked(reached), _stacked(hits))


def _narrow(counts: np.ndarray) -> np.ndarray:
    """Per-position block counts in the narrowest integer type that holds them."""
    top = int(counts.max()) if counts.size else 0
    return counts.astype(np.int16 if top < 2**15 else np.int32)


def _stacked(matrices: list[np.ndarray]) -> np.ndarray:
    """Position matrices one under another, the narrower padded with zeros (positions never reached)."""
    width = max((m.shape[1] for m in matrices), default=0)
    padded = [np.pad(m, ((0, 0), (0, width - m.shape[1]))) for m in matrices]
    return _narrow(np.concatenate(padded)) if padded else np.zeros((0, 0), np.int16)


def concat_requests(parts: list[Requests], cells: pd.DataFrame) -> Requests:
    """Several folders' `Requests` as the run's (their cell numbers already the run's)."""
    rows = concat_frames([part.rows for part in parts])
    return Requests(cells, rows, _stacked([p.reached for p in parts]), _stacked([p.hits for p in parts]))


def requests_from(source: pd.DataFrame | Requests) -> Requests:
    """`source` as `Requests`: itself, or counted from rows (a frame read whole, rows made by hand)."""
    if isinstance(source, Requests):
        return source
    ids = cell_ids(source)
    return requests_of(source, ids, cells_of(source, ids))
