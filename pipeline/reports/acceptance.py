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

from pipeline.reports.report import configuration_labels, method_order

CONFIG = ["target", "draft", "dtype", "turn", "method_label"]


def block_depths(row: pd.Series | dict) -> list[int]:
    """Drafted positions of each block of a row."""
    blocks = len(row["accepted_per_block"])
    shapes, chosen = row.get("verify_shapes"), row.get("shape_per_block")
    if shapes is not None and chosen is not None and len(chosen) == blocks and len(shapes):
        return [len(shapes[arm]) for arm in chosen]
    return [int(row["gamma"])] * blocks


def position_counts(row: pd.Series | dict) -> tuple[np.ndarray, np.ndarray]:
    """(reached, accepted) per draft position 1..deepest of one row's blocks."""
    depths, accepted = block_depths(row), list(row["accepted_per_block"])
    reached, hits = np.zeros(max(depths, default=0), int), np.zeros(max(depths, default=0), int)
    for i, (depth, a) in enumerate(zip(depths, accepted)):
        seen = a if i == len(accepted) - 1 else min(a + 1, depth)  # the last block: censored after a
        reached[:seen] += 1
        hits[:a] += 1
    return reached, hits


def speculative_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Speculative rows, each labelled by its configuration (method, tree and every grid field
    its label's rows differ in: `configuration_labels`), so no line pools two of them."""
    ok = rows[rows["error"].isna() & rows["gamma"].notna()]
    ok = ok[ok["accepted_per_block"].map(len) > 0]
    return ok.assign(method_label=configuration_labels(ok, CONFIG[:-1]))


def block_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with each one's accepted drafts, blocks and drafted positions: what pooled tau and
    the acceptance rate sum."""
    per_block = rows["accepted_per_block"]
    return rows.assign(accepted=per_block.map(sum), blocks=per_block.map(len),
                       drafted=[sum(block_depths(row)) for row in rows.to_dict("records")])


def per_position_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and draft position: blocks reaching it, accepting it, the pooled
    conditional acceptance, and its mean over requests (rows that reached the position)."""
    out = []
    for config, group in speculative_rows(rows).groupby(CONFIG, sort=False):
        counts = [position_counts(row) for row in group.to_dict("records")]
        depth = max(len(reached) for reached, _ in counts)
        reached = np.zeros((len(counts), depth), int)
        hits = np.zeros((len(counts), depth), int)
        for i, (r, h) in enumerate(counts):
            reached[i, : len(r)], hits[i, : len(h)] = r, h
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
    sd = speculative_rows(rows)
    return sd[CONFIG + ["sample_id"]].assign(tau=_request_tau(sd))


def _request_tau(rows: pd.DataFrame) -> pd.Series:
    """Each row's own tau: 1 + its accepted proposals over its blocks."""
    return 1 + rows["accepted_per_block"].map(sum) / rows["accepted_per_block"].map(len)


def _ordered(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return table
    key = table.apply(lambda r: (r["target"], r["draft"], r["dtype"], r["turn"] != "first", r["turn"],
                                 method_order(r["method_label"]), r.get("position", 0)), axis=1)
    return table.loc[key.sort_values().index].reset_index(drop=True)
