"""Tables like the paper's Table 1 from the results dataset: block efficiency per method x dataset.

tau of a cell is pooled over every block of every sample (SPEC §1):
1 + sum(accepted proposals) / sum(blocks), error rows left out. `Avg.` is the mean of the
benchmark datasets' cells, as in the paper (OOD datasets are reported beside it, not in it).
"""
from __future__ import annotations

import pandas as pd

from pipeline.decoding.config import METHOD_LETTERS

TABLE_INDEX = ["target", "draft", "turn", "method_label"]
# Grid fields shown as extra index levels only where rows of one method and dataset differ in them.
VARYING = ["policy", "window", "distance", "gamma", "temperature", "seed", "max_new_tokens", "mode"]
AVERAGE = "Avg."


def method_order(label: str) -> tuple:
    """AR first, then by ensemble size, letters in M, T, C, P order, static before TABED (*)."""
    methods = label.rstrip("*")
    if methods == "AR":
        return (0, (), False)
    return (len(methods), tuple(METHOD_LETTERS.index(m) for m in methods), label.endswith("*"))


def pooled_tau(group: pd.DataFrame) -> float:
    accepted = group["accepted_per_block"].map(sum).sum()
    blocks = group["blocks"].sum()
    return float("nan") if blocks == 0 else 1.0 + accepted / blocks


def tau_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows: target, draft, turn, method (plus any grid field that varies); columns: benchmark
    datasets, then the others (OOD, NLP), each alphabetically, then `Avg.` over the benchmark ones."""
    ok = df[df["error"].isna()].copy()
    cell = ok.groupby(TABLE_INDEX + ["dataset"], sort=False)
    index = TABLE_INDEX + [c for c in VARYING if cell[c].nunique(dropna=False).max() > 1]
    for column in index:  # NaN (e.g. window ALL) would drop out of groupby keys
        ok[column] = ok[column].astype(object).where(ok[column].notna(), "-")
    seen = sorted(set(ok["dataset"]))
    benchmark = [d for d in seen if (ok.loc[ok["dataset"] == d, "category"] == "benchmark").any()]
    datasets = benchmark + [d for d in seen if d not in benchmark]
    cells = ok.groupby(index + ["dataset"], sort=False).apply(pooled_tau, include_groups=False)
    table = cells.unstack("dataset").reindex(columns=datasets)
    if benchmark:
        table[AVERAGE] = table[benchmark].mean(axis=1)
    def row_order(i: int) -> tuple:
        target, draft, turn, label, *rest = table.index[i]
        return (target, draft, turn != "first", turn, method_order(label), tuple(str(v) for v in rest))

    order = sorted(range(len(table)), key=row_order)
    return table.iloc[order]


def error_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Failed samples per dataset and turn (rows left out of `tau_table`)."""
    failed = df[df["error"].notna()]
    return failed.groupby(["dataset", "turn"]).size().rename("errors").reset_index()
