"""Tables like the paper's Table 1 from the results dataset: block efficiency per method x dataset.

tau of a cell is pooled over every block of every sample (docs/algorithm.md §1):
1 + sum(accepted proposals) / sum(blocks), error rows left out. `Avg.` is the mean of the
benchmark datasets' cells, as in the paper (OOD datasets are reported beside it, not in it).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from pipeline.drafting.methods import method_order as letter_order
from pipeline.reports.marks import Marks, best_marks, marks_caption
from pipeline.reports.pooling import BLOCKS, pooled_taus, present

# A pair is its target, draft and dtype: rows of one target/draft in fp32 and bf16 are two experiments,
# and no table pools them (a tree is its own method label: `with_tree_labels`; batched rows are read by
# the batch sweep's table only: `decoded_alone`).
PAIR = ["target", "draft", "dtype"]
TABLE_INDEX = [*PAIR, "turn", "method_label"]
# Grid fields shown as extra index levels only where rows of one method and dataset differ in them.
# `mode` is not among them: live and replay rows of one configuration give the same accepted counts
# (pipeline.reports.fidelity measures how often).
VARYING = ["policy", "engine", "window", "distance", "gamma", "temperature", "seed", "max_new_tokens"]
AVERAGE = "Avg."


def method_order(label: str) -> tuple:
    """AR first, then by ensemble size, letters in M, T, C, P order, static before TABED (*),
    chains before token trees (`MT* (candidates)`), then by the fields a figure's label adds
    (`MT*, temperature 1.0`: `configuration_labels`)."""
    label, _, fields = label.partition(", ")
    base, _, tree = label.partition(" (")
    methods = base.rstrip("*")
    if methods == "AR":
        return (0, (), False, "", fields)
    return (len(methods), letter_order(methods), base.endswith("*"), tree, fields)


def with_tree_labels(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with the method label of tree-verified rows naming the tree, e.g.
    `MT* (candidates)`, so no table or figure pools a tree with the chain of the same methods;
    chains, AR and rows from before trees keep the paper's labels."""
    if "verify" not in rows:
        return rows
    tree = rows["verify"].notna() & (rows["verify"] != "chain")
    label, verify = rows["method_label"].astype("str"), rows["verify"].astype("str")  # text, if read as codes
    return rows.assign(method_label=label.where(~tree, label + " (" + verify + ")"))


def with_dashes(rows: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """`rows` with nulls of `columns` as `-` (window ALL, AR's gamma), which groupby keys would drop."""
    return rows.assign(**{c: rows[c].astype(object).where(rows[c].notna(), "-") for c in columns})


def configuration_labels(rows: pd.DataFrame, within: list[str]) -> pd.Series:
    """Each row's method label (trees named: `with_tree_labels`) followed by every grid field of
    `VARYING` in which rows of that label differ within `within` (e.g. pair, turn and dataset),
    as `MT*, temperature 1.0`: what a figure names a configuration by, so that it never pools
    two of them."""
    labelled = with_tree_labels(rows)
    fields = [c for c in VARYING if c in rows]
    shown = with_dashes(rows[fields], fields)
    if "gamma" in fields:
        shown["gamma"] = gamma_shown(rows)
    keyed = pd.concat([labelled[within + ["method_label"]], shown], axis=1)
    groups = keyed.groupby(within + ["method_label"], sort=False)
    varying = [c for c in fields if groups[c].nunique().max() > 1]
    if not varying:
        return labelled["method_label"]
    value = lambda v: f"{v:g}" if isinstance(v, float) else str(v)
    label = labelled["method_label"]
    for c in varying:  # one string per distinct value, not one per row
        label = label + shown[c].map({v: f", {c.replace('_', ' ')} {value(v)}" for v in shown[c].unique()})
    return label


def gamma_shown(rows: pd.DataFrame) -> pd.Series:
    """Each row's draft steps per block as tables print them: the grid's gamma (an int), `-` for
    AR, and `depth d` for a tree whose shape sets its depth (a shape tree; a bandit's shapes span
    `depth 4-6`), which a gamma-5 grid did not ask for and must not read as a second gamma."""
    shown = pd.Series("-", index=rows.index, dtype=object)
    known = rows["gamma"].notna().to_numpy()
    shown[known] = [int(gamma) for gamma in rows["gamma"][known]]
    if "verify_shapes" not in rows:
        return shown
    values = rows["verify_shapes"].to_numpy(dtype=object)
    # one label per object: rows read by the report share one object per distinct value
    _, first, inverse = np.unique(np.fromiter(map(id, values), np.int64, len(values)),
                                  return_index=True, return_inverse=True)
    labels = np.array([_depth_label(values[i]) for i in first], dtype=object)[inverse]
    trees = np.not_equal(labels, None)
    shown[trees] = labels[trees]
    return shown


def _depth_label(tree_shapes) -> str | None:
    """`depth d` (or `depth a-b`) for a list of tree shapes; None for no shapes (a chain, NaN)."""
    if not (hasattr(tree_shapes, "__len__") and len(tree_shapes)):
        return None
    depths = sorted({len(shape) for shape in tree_shapes})
    return f"depth {depths[0]}" + (f"-{depths[-1]}" if len(depths) > 1 else "")


def grid_gammas(rows: pd.DataFrame) -> str:
    """The gammas a run's rows ran as the grid gave them, e.g. `5` (trees with their own depth
    are not among them: `gamma_shown`), `-` when none."""
    gammas = sorted({g for g in gamma_shown(rows) if isinstance(g, int)})
    return ", ".join(map(str, gammas)) or "-"


def batch_of(rows: pd.DataFrame) -> pd.Series:
    """Each row's batch size: requests decoded together (1 for rows from before the batch axis)."""
    if "batch" not in rows:
        return pd.Series(1, index=rows.index, dtype=int)
    return rows["batch"].astype(object).where(rows["batch"].notna(), 1).astype(int)


def decoded_alone(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of batch 1, which every table but the batch sweep's and the audit reads: a
    batched row's walltime is its batch's and its configuration is counted at batch 1."""
    return rows[batch_of(rows) == 1]


def wall_times(rows: pd.DataFrame) -> pd.Series:
    """Each row's decode wall clock, host overhead included (rows from before it was recorded:
    the phases' total), as the exports write it and MMSpec's speedups divide by."""
    total = rows["time_total_s"].astype(float)
    return rows["time_wall_s"].astype(float).fillna(total) if "time_wall_s" in rows else total


def tau_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows: target, draft, dtype, turn, method (plus any grid field that varies); columns: benchmark
    datasets, then the others (OOD, NLP), each alphabetically, then `Avg.` over the benchmark ones."""
    read = [*TABLE_INDEX, *VARYING, "dataset", "category", "verify", "verify_shapes", *BLOCKS]
    ok = with_tree_labels(df.loc[df["error"].isna(), present(df, read)])
    ok["gamma"] = gamma_shown(ok)
    cell = ok.groupby(TABLE_INDEX + ["dataset"], sort=False)
    index = TABLE_INDEX + [c for c in VARYING if cell[c].nunique(dropna=False).max() > 1]
    ok = with_dashes(ok, index)
    seen = sorted(set(ok["dataset"]))
    benchmark = [d for d in seen if (ok.loc[ok["dataset"] == d, "category"] == "benchmark").any()]
    datasets = benchmark + [d for d in seen if d not in benchmark]
    cells = pooled_taus(ok, index + ["dataset"])
    table = cells.unstack("dataset").reindex(columns=datasets)
    if benchmark:
        table[AVERAGE] = table[benchmark].mean(axis=1)
    def row_order(i: int) -> tuple:
        target, draft, dtype, turn, label, *rest = table.index[i]
        return (target, draft, dtype, turn != "first", turn, method_order(label), tuple(str(v) for v in rest))

    order = sorted(range(len(table)), key=row_order)
    return table.iloc[order]


def error_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Failed samples per dataset and turn (rows left out of `tau_table`)."""
    failed = df[df["error"].notna()]
    return failed.groupby(["dataset", "turn"]).size().rename("errors").reset_index()


# ------------------------------------------------------------ paper-style summaries on disk

# policy too: MT with the grid policy and MT with inverse-error weights are both "MT*"
SUMMARY_INDEX = [*PAIR, "method_label", "policy"]
def category_table(df: pd.DataFrame) -> pd.DataFrame:
    """Paper Table 2: mean of per-dataset pooled tau within each category and turn group
    (benchmark first turn, benchmark second turn, OOD first turn)."""
    read = [*SUMMARY_INDEX, "category", "turn", "dataset", "verify", *BLOCKS]
    ok = with_tree_labels(df.loc[df["error"].isna(), present(df, read)])
    cells = pooled_taus(ok, SUMMARY_INDEX + ["category", "turn", "dataset"], sort=True)
    cells = cells.rename("tau").reset_index()
    turn, category = cells["turn"].astype("str"), cells["category"].astype("str")  # text, if read as codes
    cells["group"] = category.str.capitalize() + " " + turn.where(turn == "first", "second")
    table = cells.groupby(SUMMARY_INDEX + ["group"])["tau"].mean().unstack("group")
    order = sorted(table.columns, key=lambda c: (not c.startswith("Benchmark"), c.endswith("second"), c))
    table = table[order]
    return table.iloc[sorted(range(len(table)),
                             key=lambda i: (table.index[i][:3], method_order(table.index[i][3])))]


MARKDOWN_ESCAPES = str.maketrans({"|": "\\|", "\n": " ", "\r": " "})


def escaped(value: object) -> str:
    """`value` as the text of one Markdown table cell: a model folder or dataset named with `|`
    or a line break must not split the row (a tag-like name: `without_html`)."""
    return without_html(str(value).translate(MARKDOWN_ESCAPES))


HTML_TAG = re.compile(r"<(?=[A-Za-z/!?])")


def without_html(text: str) -> str:
    """`text` with every `<` that would open an HTML tag written as `&lt;`: a model folder or
    dataset named like a tag, which captions and sentences quote, must not turn into HTML when
    the summary is rendered (arrows `<-` and bounds `<128` stay as written)."""
    return HTML_TAG.sub("&lt;", text)


def markdown_table(table: pd.DataFrame, marks: Marks | None = None) -> str:
    """Markdown with, where `marks` says so, the best value of a column in bold and the second
    best in italics (`pipeline.reports.marks`), and the sentence saying so under it."""
    flat = table.reset_index()
    index_columns = list(table.index.names)
    style = {"best": "**", "second": "*"}
    found = {key: style[mark] for key, mark in best_marks(table, marks).items()} if marks else {}
    header = "| " + " | ".join(escaped(c) for c in index_columns + list(table.columns)) + " |"
    lines = [header, "|" + "---|" * (len(index_columns) + len(table.columns))]
    for i, row in flat.iterrows():
        cells = [escaped(row[c]) for c in index_columns]
        for column in table.columns:
            value = row[column]
            text = "-" if pd.isna(value) else f"{value:.2f}" if isinstance(value, float) else escaped(value)
            mark = found.get((i, column), "")
            cells.append(f"{mark}{text}{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    caption = marks_caption(table, marks) if found else ""
    return "\n".join(lines) + (f"\n\n{caption}" if caption else "")


# ------------------------------------------------------------ what the table says, in words

# The paper's TABED rows: MT with the grid policy (MT*) and MTCP with inverse-error weights (MTCP*).
PAPER_DYNAMIC = {"MT*": "grid", "MTCP*": "inverse"}


def method_findings(df: pd.DataFrame) -> pd.DataFrame:
    """Per pair, turn and dataset: pooled tau of M and T and which is higher, the best SD
    configuration, and where the paper's MT* and MTCP* rank among all SD configurations run
    (1 = best; configurations are method set x policy; equal tau at two decimals share a rank)."""
    keys = [*PAIR, "turn", "dataset"]
    read = [*keys, "method_label", "policy", "policy_kind", "verify", *BLOCKS]
    ok = with_tree_labels(df.loc[df["error"].isna() & (df["method_label"] != "AR"),
                                 present(df, read)])
    if ok.empty:  # e.g. a run stopped before any speculative row was written
        return pd.DataFrame(columns=keys)
    cells = pooled_taus(ok, keys + ["method_label", "policy", "policy_kind"], sort=True)
    rows = []
    for key, group in cells.rename("tau").reset_index().groupby(keys, sort=False):
        group = group.sort_values("tau", ascending=False, kind="stable").reset_index(drop=True)
        single = group[~group["method_label"].str.endswith("*")].set_index("method_label")["tau"]
        row = dict(zip(keys, key))
        row["M"], row["T"] = single.get("M", float("nan")), single.get("T", float("nan"))
        if pd.notna(row["M"]) and pd.notna(row["T"]):
            gap = round(row["M"] - row["T"], 2)
            row["M vs T"] = "tie" if gap == 0 else f"{'M' if gap > 0 else 'T'} +{abs(gap):.2f}"
        best = group.iloc[0]
        row["best"] = f"{_config_name(best, group)} {best['tau']:.2f}"
        for label, kind in PAPER_DYNAMIC.items():
            hit = group[(group["method_label"] == label) & (group["policy_kind"] == kind)]
            if not hit.empty:
                tau = hit["tau"].iloc[0]
                rank = 1 + int((group["tau"].round(2) > round(tau, 2)).sum())  # ties share a rank
                row[label] = f"{tau:.2f} (rank {rank}/{len(group)})"
        rows.append(row)
    rows.sort(key=lambda r: (*(r[k] for k in PAIR), r["turn"] != "first", r["turn"], r["dataset"]))
    table = pd.DataFrame(rows) if rows else pd.DataFrame(columns=keys)
    columns = keys + ["M", "T", "M vs T", "best"] + list(PAPER_DYNAMIC)
    return table[[c for c in columns if c in table]].set_index(keys)


def _config_name(row: pd.Series, group: pd.DataFrame) -> str:
    """The method label, with its policy where that label ran under several policies."""
    label = row["method_label"]
    return label if (group["method_label"] == label).sum() == 1 else f"{label} {row['policy']}"


def findings_text(findings: pd.DataFrame) -> str:
    """Plain sentences over `method_findings`: where M beats T, where T beats M, where MT* lands."""
    if findings.empty or "M vs T" not in findings:
        return "M and T were not both run: no comparison."
    findings = findings.reset_index()
    several_pairs = findings[PAIR].drop_duplicates().shape[0] > 1
    name = lambda r: f"{r.dataset} ({r.turn}{f', {r.target} / {r.draft} {r.dtype}' if several_pairs else ''})"
    where = lambda mask: ", ".join(name(r) for r in findings[mask].itertuples()) or "nowhere"
    verdict = findings["M vs T"].fillna("")
    lines = [
        f"- M beats T on: {where(verdict.str.startswith('M'))}.",
        f"- T beats M on: {where(verdict.str.startswith('T'))}.",
    ]
    if (verdict == "tie").any():
        lines.append(f"- M and T tie on: {where(verdict == 'tie')}.")
    for label in PAPER_DYNAMIC:
        if label in findings:
            placed = ", ".join(f"{name(r)} {r[label]}" for _, r in findings.dropna(subset=[label]).iterrows())
            lines.append(f"- {label} lands at: {placed}.")
    return "\n".join(lines)
