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
from pipeline.reports.requests import Requests, requests_from

CONFIG = ["target", "draft", "dtype", "turn", "method_label"]


def speculative_rows(source: pd.DataFrame | Requests) -> pd.DataFrame:
    """The speculative rows with blocks, one line each: `CONFIG`, its method label naming its
    configuration (method, tree and every grid field its label's rows differ in:
    `configuration_labels`), so no line pools two of them; its counts and sample
    (`requests.Requests`); `line`: its line in the position matrices. Each column is made
    once, from arrays: over ten million rows, every copy of the frame costs 400 MB."""
    requests = requests_from(source)
    counted = requests.rows["counted"].to_numpy()
    cell = requests.rows["cell"].to_numpy()[counted]
    used, where = np.unique(cell, return_inverse=True)
    labels = pd.Categorical(configuration_labels(requests.cells.loc[used], CONFIG[:-1]).to_numpy())
    columns = {c: requests.spread(c, cell) for c in CONFIG[:-1]}
    columns["method_label"] = pd.Categorical.from_codes(labels.codes[where], dtype=labels.dtype)
    for name in requests.rows.columns.drop(["cell", "counted"]):
        columns[name] = requests.rows[name].array[counted]
    columns["line"] = np.arange(len(cell), dtype=np.int32)
    return pd.DataFrame(columns, copy=False)


def per_position_table(source: pd.DataFrame | Requests) -> pd.DataFrame:
    """Per configuration and draft position: blocks reaching it, accepting it, the pooled
    conditional acceptance, and its mean over requests (rows that reached the position)."""
    requests, out = requests_from(source), []
    for config, group in speculative_rows(requests).groupby(CONFIG, sort=False, observed=True):
        depth, lines = int(group["deepest"].max()), group["line"].to_numpy()
        reached, hits = requests.reached[lines, :depth], requests.hits[lines, :depth]
        for k in range(depth):
            seen = reached[:, k] > 0
            out.append(dict(zip(CONFIG, config)) | {
                "position": k + 1, "reached": int(reached[:, k].sum()), "accepted": int(hits[:, k].sum()),
                "acceptance": hits[:, k].sum() / reached[:, k].sum() if reached[:, k].sum() else np.nan,
                "acceptance_per_request": (hits[seen, k] / reached[seen, k]).mean() if seen.any() else np.nan,
            })
    return _ordered(pd.DataFrame(out, columns=[*CONFIG, "position", "reached", "accepted", "acceptance",
                                               "acceptance_per_request"]))


def acceptance_table(source: pd.DataFrame | Requests) -> pd.DataFrame:
    """Per configuration: both tau conventions (pooled), the acceptance rate, and tau per
    request (median, quartiles, min, max), so the spread stands beside the mean."""
    out = []
    for config, group in speculative_rows(source).groupby(CONFIG, sort=False, observed=True):
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


def request_taus(source: pd.DataFrame | Requests) -> pd.DataFrame:
    """tau of each request (sample) per configuration, for a distribution figure."""
    sd = speculative_rows(source)
    return sd[CONFIG + ["sample_id"]].assign(tau=_request_tau(sd))


def _request_tau(counted: pd.DataFrame) -> pd.Series:
    """Each row's own tau: 1 + its accepted proposals over its blocks."""
    return 1 + counted["accepted"] / counted["blocks"]


def _ordered(table: pd.DataFrame) -> pd.DataFrame:
    if table.empty:
        return table
    key = table.apply(lambda r: (r["target"], r["draft"], r["dtype"], r["turn"] != "first", r["turn"],
                                 method_order(r["method_label"]), r.get("position", 0)), axis=1)
    return table.loc[key.sort_values().index].reset_index(drop=True)
