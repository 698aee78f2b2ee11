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
# `mode` is not among them: live and replay rows of one configuration give the same accepted counts.
VARYING = ["policy", "window", "distance", "gamma", "temperature", "seed", "max_new_tokens"]
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


# ------------------------------------------------------------ paper-style summaries on disk

# policy too: MT with the grid policy and MT with inverse-error weights are both "MT*"
SUMMARY_INDEX = ["target", "draft", "method_label", "policy"]


def category_table(df: pd.DataFrame) -> pd.DataFrame:
    """Paper Table 2: mean of per-dataset pooled tau within each category and turn group
    (benchmark first turn, benchmark second turn, OOD first turn)."""
    ok = df[df["error"].isna()]
    cells = ok.groupby(SUMMARY_INDEX + ["category", "turn", "dataset"]).apply(pooled_tau, include_groups=False)
    cells = cells.rename("tau").reset_index()
    cells["group"] = cells["category"].str.capitalize() + " " + cells["turn"].where(cells["turn"] == "first", "second")
    table = cells.groupby(SUMMARY_INDEX + ["group"])["tau"].mean().unstack("group")
    order = sorted(table.columns, key=lambda c: (not c.startswith("Benchmark"), c.endswith("second"), c))
    table = table[order]
    return table.iloc[sorted(range(len(table)), key=lambda i: (table.index[i][:2], method_order(table.index[i][2])))]


def speedup_table(df: pd.DataFrame, calibrations: pd.DataFrame) -> pd.DataFrame:
    """Expected speedup from pooled first-turn tau and measured latency ratios, beside the
    measured walltime speedup of live runs (AR time / SD time over the samples both ran).

    `eq1` is the paper's tau / (gamma Tq/Tp + 1); `corrected` uses the draft latency of an
    m-row batch and the measured cost of a (gamma+1)-token verify, which is not 1 on a CPU.
    """
    ok = df[df["error"].isna() & (df["turn"] == "first")]
    rows = []
    for (target, draft, label, policy), group in ok.groupby(SUMMARY_INDEX):
        gamma = group["gamma"].dropna()
        row = {"target": target, "draft": draft, "method_label": label, "policy": policy, "tau": pooled_tau(group)}
        calib = calibrations[(calibrations["target"] == target) & (calibrations["draft"] == draft)] if not calibrations.empty else calibrations
        if label != "AR" and len(gamma) and not calib.empty:
            c, g, m = calib.iloc[0], int(gamma.iloc[0]), len(label.rstrip("*"))
            rows_ratio = list(c["draft_rows_token_s"])[min(m, len(c["draft_rows_token_s"])) - 1] / c["target_token_s"]
            row["eq1"] = row["tau"] / (g * c["ratio_draft_target"] + 1)
            row["corrected"] = row["tau"] / (g * rows_ratio + c["ratio_verify"])
        row["measured"] = _measured_speedup(ok[ok["policy"] == policy], ok, target, draft, label)
        rows.append(row)
    table = pd.DataFrame(rows).reindex(columns=SUMMARY_INDEX + ["tau", "eq1", "corrected", "measured"])
    table = table.set_index(SUMMARY_INDEX)
    return table.iloc[sorted(range(len(table)), key=lambda i: (table.index[i][:2], method_order(table.index[i][2])))]


def _measured_speedup(rows: pd.DataFrame, ok: pd.DataFrame, target: str, draft: str, label: str) -> float:
    """AR walltime / SD walltime of `rows` (one policy), over the samples both ran live."""
    in_pair = lambda df: df[(df["target"] == target) & (df["draft"] == draft)]
    ar = in_pair(ok)[in_pair(ok)["mode"] == "ar"].groupby("sample_id")["time_total_s"].mean()
    live = in_pair(rows)[(in_pair(rows)["method_label"] == label) & (in_pair(rows)["mode"].isin(["live", "ar"]))]
    sd = live.groupby("sample_id")["time_total_s"].mean()
    both = ar.index.intersection(sd.index)
    if label == "AR":
        return 1.0 if not ar.empty else float("nan")
    if both.empty or sd[both].sum() <= 0:
        return float("nan")
    return float(ar[both].sum() / sd[both].sum())


def markdown_table(table: pd.DataFrame, mark_best: bool = True) -> str:
    """Markdown with the best value of each column in bold and the second best in italics
    (AR rows and the index left unmarked), as the paper marks its tables."""
    flat = table.reset_index()
    index_columns = list(table.index.names)
    marks: dict[tuple[int, str], str] = {}
    if mark_best:
        candidates = flat[flat["method_label"] != "AR"] if "method_label" in flat else flat
        for column in table.columns:
            values = candidates[column].dropna().round(2)
            ranked = sorted(values.unique(), reverse=True)
            for rank, mark in zip(ranked[:2], ("**", "*")):
                for i in values[values == rank].index:
                    marks[(i, column)] = mark
    header = "| " + " | ".join(map(str, index_columns + list(table.columns))) + " |"
    lines = [header, "|" + "---|" * (len(index_columns) + len(table.columns))]
    for i, row in flat.iterrows():
        cells = [str(row[c]) for c in index_columns]
        for column in table.columns:
            value = row[column]
            text = "-" if pd.isna(value) else f"{value:.2f}"
            mark = marks.get((i, column), "")
            cells.append(f"{mark}{text}{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
