"""The summary's first lines: the answer before the evidence. Per pair, the best chain and the
best token tree by first-turn tau, with their measured and expected (Eq. 1 corrected) speedups
and whether those figures are reliable; then the lossless audit in one line and where to look
next. At most `MAX_LINES` lines, whatever the grid's size (more pairs: the speedup table).
"""
from __future__ import annotations

import pandas as pd

from pipeline.reports.noise import flagged_columns
from pipeline.reports.speedup import UNTIMED

MAX_LINES = 15


def headline(speedup: pd.DataFrame, lossless: pd.DataFrame) -> str:
    """`speedup`: `speedup_table`'s; `lossless`: `audit`'s table (rows, `equal to AR`)."""
    lines = ["## Headline", ""]
    table = speedup.reset_index()
    table = table[table["method_label"] != "AR"]
    pairs = list(dict.fromkeys(zip(table["target"], table["draft"], table["dtype"])))
    room = MAX_LINES - 2 - 3  # the title, its blank line, and the three closing lines
    for pair in pairs[:room]:
        mine = table[(table[["target", "draft", "dtype"]] == pair).all(axis=1)]
        tree = mine["method_label"].str.contains(r" \(", regex=True)
        parts = [_best(mine[~tree], "chain"), _best(mine[tree], "tree")]
        lines.append(f"- {pair[1]} drafting for {pair[0]} ({pair[2]}): "
                     + "; ".join(part for part in parts if part) + ".")
    if len(pairs) > room:
        lines.append(f"- ... and {len(pairs) - room} more pairs: the speedup table.")
    lines.append(f"- Lossless: {_lossless(lossless)}")
    lines.append("- Measured = AR walltime / SD walltime on the timed samples; expected = Eq. 1 corrected "
                 "for the block's real shape, from the calibration.")
    lines.append("- Next: the speedup table (every configuration), `tau.png`, and Measurement noise "
                 "where a figure says `unreliable`.")
    return "\n".join(lines)


def _best(rows: pd.DataFrame, kind: str) -> str:
    """`best chain MT* grid(hard+soft), tau 3.12: measured 1.34x, expected 1.51x`."""
    if rows.empty:
        return ""
    timed = rows[rows["timed_on"] != UNTIMED]
    pool = timed if len(timed) else rows
    best = pool.loc[pool["tau"].idxmax()]
    name = best["method_label"] + ("" if best["policy"] == "static" else f" {best['policy']}")
    gamma = best["gamma"]
    name += f", gamma {gamma}" if isinstance(gamma, int) else f", {gamma}" if gamma != UNTIMED else ""
    unreliable = flagged_columns(best.get("noise", ""))
    figures = [_speed(label, best.get(column), column in unreliable)
               for label, column in (("measured", "measured"), ("expected", "corrected"))]
    return f"best {kind} {name}, tau {best['tau']:.2f}: " + ", ".join(figures)


def _speed(label: str, value, unreliable: bool) -> str:
    """`measured 1.34x`, `measured 0.93x (unreliable: noise)`, or `not timed` / `not calibrated`."""
    if value is None or pd.isna(value):
        return "not timed" if label == "measured" else "not calibrated"
    return f"{label} {value:.2f}x" + (" (unreliable: noise)" if unreliable else "")


def _lossless(table: pd.DataFrame) -> str:
    if table.empty:
        return "no greedy speculative row had an AR row to compare with."
    rows, equal = int(table["rows"].sum()), int(table["equal to AR"].sum())
    verdict = "every one" if rows == equal else f"{rows - equal} differ (see the lossless audit)"
    return f"{equal}/{rows} greedy speculative rows equal the target's own greedy output: {verdict}."
