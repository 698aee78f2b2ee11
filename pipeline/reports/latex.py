"""The paper's Table 1 and Table 2 forms as LaTeX (booktabs), for pasting into a paper.

Best values are bold and second-best underlined within each block of rows (one pair's turn),
with the same tie rule as the Markdown tables (`pipeline.reports.marks.best_marks`).
Out-of-distribution columns carry a dagger, explained under the table. Needs `\\usepackage{booktabs}`.
"""
from __future__ import annotations

import pandas as pd

from pipeline.reports.marks import best_marks
from pipeline.reports.report import grid_gammas

STYLE = {"best": "\\textbf{%s}", "second": "\\underline{%s}"}
OOD_MARK = "$^{\\dagger}$"


SPECIAL = {"&": "\\&", "%": "\\%", "_": "\\_", "#": "\\#", "$": "\\$", "{": "\\{", "}": "\\}",
           "\\": "\\textbackslash{}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}", "*": "$^{*}$"}


def escape(text: object) -> str:
    """Text safe inside a LaTeX cell (a star, as in MT*, becomes a superscript)."""
    return "".join(SPECIAL.get(char, char) for char in str(text))


def latex_table(
    table: pd.DataFrame, *, caption: str, label: str, ood_columns: set[str] = frozenset(),
    titles: dict[str, str] | None = None,
) -> str:
    """A `table` with a `method_label` index level as a booktabs table: one block per value of
    the levels before `method_label` (headed by them), one row per method, one column per
    table column (renamed by `titles`, OOD columns daggered)."""
    titles = titles or {}
    flat = table.reset_index()
    levels = list(table.index.names)
    block_levels = levels[: levels.index("method_label")]
    marks = best_marks(table)
    header = ["Method"] + [escape(titles.get(c, c)) + (OOD_MARK if c in ood_columns else "")
                           for c in table.columns]
    lines = [
        "\\begin{table}[t]", "\\centering", "\\small",
        f"\\begin{{tabular}}{{l{'c' * len(table.columns)}}}", "\\toprule", " & ".join(header) + " \\\\",
    ]
    groups = flat.groupby(block_levels, sort=False) if block_levels else [((), flat)]
    for key, block in groups:
        key = key if isinstance(key, tuple) else (key,)
        lines.append("\\midrule")
        if block_levels:
            heading = block_heading(dict(zip(block_levels, key)))
            lines.append(f"\\multicolumn{{{len(header)}}}{{l}}{{\\emph{{{heading}}}}} \\\\")
        repeated = block["method_label"].duplicated(keep=False)
        for i, row in block.iterrows():
            name = (escape(row["method_label"])
                    + (f" ({escape(row['policy'])})" if repeated[i] and "policy" in row else ""))
            cells = [name]
            for column in table.columns:
                value = row[column]
                text = "--" if pd.isna(value) else f"{value:.2f}"
                cells.append(STYLE[marks[(i, column)]] % text if (i, column) in marks else text)
            lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    note = f" {OOD_MARK} out of distribution." if ood_columns & set(table.columns) else ""
    lines += [f"\\caption{{{escape(caption)}{note}}}", f"\\label{{{label}}}", "\\end{table}"]
    return "\n".join(lines) + "\n"


def block_heading(key: dict) -> str:
    """`target <- draft, <turn> turn` for a block of rows."""
    parts = [escape(v) for k, v in key.items() if k not in ("target", "draft", "turn")]
    if "target" in key and "draft" in key:
        parts.insert(0, f"{escape(key['target'])} $\\leftarrow$ {escape(key['draft'])}")
    if "turn" in key:
        parts.append(f"{escape(key['turn'])} turn")
    return ", ".join(parts)


def dataset_titles(names: list[str]) -> dict[str, str]:
    """The paper's column names of registered datasets (a user's dataset keeps its name)."""
    from pipeline.data.registry import DATASETS

    return {name: DATASETS[name].title for name in names if name in DATASETS}


def paper_tables(rows: pd.DataFrame, tau: pd.DataFrame, categories: pd.DataFrame) -> dict[str, str]:
    """table1.tex (tau per dataset) and table2.tex (category averages) of one run's rows."""
    ok = rows[rows["error"].isna()]
    ood = set(ok.loc[ok["category"] != "benchmark", "dataset"])
    where = f"gamma {grid_gammas(ok)}; best bold, second underlined"
    return {
        "table1.tex": latex_table(tau, caption=f"Block efficiency tau per dataset ({where}).",
                                  label="tab:tau", ood_columns=ood, titles=dataset_titles(list(tau.columns))),
        "table2.tex": latex_table(categories, caption=f"Category averages of tau ({where}).",
                                  label="tab:categories",
                                  ood_columns={c for c in categories.columns if c.lower().startswith("ood")}),
    }
