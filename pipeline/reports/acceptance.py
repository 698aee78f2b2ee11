"""Acceptance in the conventions other tools report, from each row's accepted counts and block
shapes, so a figure here lines up with a paper's or a serving engine's:

- **tau** (block efficiency, the TABED paper's): accepted proposals + 1 per block, pooled over
  blocks. **tau0** = tau - 1: accepted drafts per block (EAGLE's and ViSpec's "acceptance length").
- **acceptance rate**: accepted drafts / drafted positions, a block drafting its depth (gamma for
  chains and candidate trees, the chosen shape's depth for a bandit's block).
- **per-position acceptance** at draft position k: the blocks that accepted position k among
  those that reached it (accepted the k - 1 before it, and drafted at least k). A row's last
  block is censored after its accepted count: it may have been cut by EOS or the token budget
  rather than rejected there.
- **per request**: tau of each sample, whose spread pooling hides (long answers weigh more).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.reports.pooling import flat_values, list_lengths, present, row_sums
from pipeline.reports.report import VARYING, configuration_labels, method_order

CONFIG = ["target", "draft", "dtype", "turn", "method_label"]
# What the acceptance tables read of a speculative row: its configuration, the fields its label
# may name (`configuration_labels`), its sample and its blocks.
READ = [*CONFIG, "verify", *VARYING, "sample_id", "accepted_per_block", "verify_shapes", "shape_per_block"]


def _shape_depths(shapes: object, chosen: object, blocks: int) -> np.ndarray | None:
    """Drafted positions of each of a row's `blocks` where a bandit recorded its chosen shape per
    block (the shape's depth); None for every other row, which drafts gamma in each block."""
    if shapes is not None and chosen is not None and len(chosen) == blocks and len(shapes):
        return np.asarray([len(shape) for shape in shapes], int)[np.asarray(chosen, int)]
    return None


def _blocks(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(each row's number of blocks, its depth per block where the grid's gamma sets it: 0
    where the row's blocks have their own depths, `_bandit_depths`)."""
    lengths = list_lengths(rows["accepted_per_block"])
    gammas = np.fromiter((int(g) if n else 0 for g, n in zip(rows["gamma"], lengths)), int, len(lengths))
    return lengths, gammas


def _bandit_depths(rows: pd.DataFrame, lengths: np.ndarray) -> dict[int, np.ndarray]:
    """Drafted positions of each block, by row position, of the rows whose bandit recorded its
    chosen shape per block."""
    if "verify_shapes" not in rows or "shape_per_block" not in rows:
        return {}
    recorded = np.flatnonzero((list_lengths(rows["shape_per_block"]) == lengths) & (lengths > 0))
    chosen = zip(recorded, rows["verify_shapes"].iloc[recorded], rows["shape_per_block"].iloc[recorded])
    return {i: depths for i, shapes, picks in chosen
            if (depths := _shape_depths(shapes, picks, lengths[i])) is not None}


def blocks_of(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every block of `rows`, flattened: (its row's position in `rows`, accepted drafts, drafted
    positions, whether it is its row's last block). Arrays, not a loop per block: a paper-scale
    run has tens of millions of blocks."""
    lengths, gammas = _blocks(rows)
    ends = np.cumsum(lengths)
    flat = flat_values(rows["accepted_per_block"]).astype(int)
    depths = np.repeat(gammas, lengths)
    for i, by_shape in _bandit_depths(rows, lengths).items():
        depths[ends[i] - lengths[i]:ends[i]] = by_shape
    last = np.zeros(int(ends[-1]) if len(ends) else 0, bool)
    last[ends[lengths > 0] - 1] = True
    return np.repeat(np.arange(len(rows)), lengths), flat, depths, last


def position_matrix(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(reached, accepted): rows x draft positions 1..deepest, for every row at once. A block
    reaches position k when it accepted the k - 1 before it and drafted at least k; a row's last
    block is censored after its accepted count."""
    row, accepted, depth, last = blocks_of(rows)
    deepest = int(depth.max()) if len(depth) else 0
    seen = np.where(last, accepted, np.minimum(accepted + 1, depth))

    def at_least(values: np.ndarray) -> np.ndarray:  # [row, k]: blocks of the row with value > k
        counts = np.zeros((len(rows), deepest + 1), int)
        np.add.at(counts, (row, np.clip(values, 0, deepest)), 1)
        return counts[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]

    return at_least(seen), at_least(accepted)


def speculative_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Speculative rows, each labelled by its configuration (method, tree and every grid field
    its label's rows differ in: `configuration_labels`), so no line pools two of them."""
    blocks = list_lengths(rows["accepted_per_block"])
    read = present(rows, READ)  # the copy holds what the tables read
    ok = rows.loc[(rows["error"].isna() & rows["gamma"].notna()).to_numpy() & (blocks > 0), read]
    return ok.assign(method_label=configuration_labels(ok, CONFIG[:-1]))


def block_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with each one's accepted drafts, blocks and drafted positions: what pooled tau and
    the acceptance rate sum."""
    lengths, gammas = _blocks(rows)
    drafted = gammas * lengths
    for i, by_shape in _bandit_depths(rows, lengths).items():
        drafted[i] = by_shape.sum()
    return rows.assign(accepted=row_sums(rows["accepted_per_block"]), blocks=lengths, drafted=drafted)


def per_position_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and draft position: blocks reaching it, accepting it, the pooled
    conditional acceptance, and its mean over requests (rows that reached the position)."""
    out = []
    for config, group in speculative_rows(rows).groupby(CONFIG, sort=False):
        reached, hits = position_matrix(group)
        depth = reached.shape[1]
        for k in range(depth):
            seen = reached[:, k] > 0
            out.append(dict(zip(CONFIG, config)) | {
                "position": k + 1, "reached": int(reached[:, k].sum()), "accepted": int(hits[:, k].sum()),
                "acceptance": hits[:, k].sum() / reached[:, k].sum() if reached[:, k].sum() else np.nan,
                "acceptance_per_request": (hits[seen, k] / reached[seen, k]).mean() if seen.any() else np.nan,
            })
    return _ordered(pd.DataFrame(out, columns=[*CONFIG, "position", "reached", "accepted", "acceptance",
                                               "acceptance_per_request"]))


def acceptance_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: both tau conventions (pooled), the acceptance rate, and tau per
    request (median, quartiles, min, max), so the spread stands beside the mean."""
    out = []
    for config, group in block_counts(speculative_rows(rows)).groupby(CONFIG, sort=False):
        per_request = _request_tau(group)
        quartiles = per_request.quantile([0.25, 0.5, 0.75])
        tau = 1 + group["accepted"].sum() / group["blocks"].sum()
        out.append(dict(zip(CONFIG, config)) | {
            "requests": len(group), "tau": tau, "tau0": tau - 1,
            "acceptance_rate": group["accepted"].sum() / group["drafted"].sum(),
            "tau_request_median": quartiles[0.5],
            "tau_request_q1": quartiles[0.25], "tau_request_q3": quartiles[0.75],
            "tau_request_min": per_request.min(), "tau_request_max": per_request.max(),
        })
    return _ordered(pd.DataFrame(out))


def request_taus(rows: pd.DataFrame) -> pd.DataFrame:
    """tau of each request (sample) per configuration, for a distribution figure."""
    sd = block_counts(speculative_rows(rows))
    return sd[CONFIG + ["sample_id"]].assign(tau=_request_tau(sd))


def _request_tau(counted: pd.DataFrame) -> pd.Series:
    """Each row's own tau: 1 + its accepted proposals over its blocks (`block_counts`' columns)."""
    return 1 + counted["accepted"] / counted["blocks"]


def _ordered(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return table
    key = table.apply(lambda r: (r["target"], r["draft"], r["dtype"], r["turn"] != "first", r["turn"],
                                 method_order(r["method_label"]), r.get("position", 0)), axis=1)
    return table.loc[key.sort_values().index].reset_index(drop=True)
