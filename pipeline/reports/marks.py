"""Best and second-best marks in a table, as the paper marks its tables, and the sentence that
says what they mean.

A table says which of its columns are marked and what a win is there (`Marks`): a higher
tau, a speedup above 1 (a slowdown is never marked, however it ranks), fewer joules per
token. Marks compare the configurations of a block: rows that differ only in the index levels
that name a configuration (`compare`: method, policy, window, distance, gamma) and share every
other (pair, turn, engine, machine, temperature...), AR rows and blocks of a single candidate
left out, values as printed (2 decimals). Ranks are competition ranks: every value tied for the
top is best, and "second" exists only when one value is best alone.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Marks:
    """Columns to mark: `higher` (more is better), `speedups` (more is better, and only above
    1 is a win), `lower` (less is better). `every_column`: all columns are `higher`.
    `compare`: the index levels that tell the configurations of a block apart."""

    higher: tuple[str, ...] = ()
    speedups: tuple[str, ...] = ()
    lower: tuple[str, ...] = ()
    every_column: bool = False
    compare: tuple[str, ...] = ("method_label", "policy", "window", "distance", "gamma")

    def rule(self, column: str) -> str | None:
        if self.every_column or column in self.higher:
            return "higher"
        return "speedup" if column in self.speedups else "lower" if column in self.lower else None


HIGHER_EVERYWHERE = Marks(every_column=True)


def block_levels(table: pd.DataFrame, marks: Marks) -> list[str]:
    """The index levels that delimit a block of compared rows: every one but `marks.compare`."""
    return [level for level in table.index.names if level not in marks.compare]


def best_marks(table: pd.DataFrame, marks: Marks = HIGHER_EVERYWHERE) -> dict[tuple[int, str], str]:
    """(row position, column) -> "best" or "second"."""
    flat = table.reset_index()
    candidates = flat[flat["method_label"] != "AR"] if "method_label" in flat else flat
    levels = block_levels(table, marks)
    blocks = [block for _, block in candidates.groupby(levels, sort=False)] if levels else [candidates]
    found: dict[tuple[int, str], str] = {}
    for column, block in itertools.product(table.columns, blocks):
        rule = marks.rule(column)
        values = pd.to_numeric(block[column], errors="coerce").dropna().round(2)
        if rule is None or len(values) < 2:
            continue
        if rule == "lower":
            values = -values
        top = values.max()
        best = values[values == top]
        found.update({(i, column): "best" for i in best.index if rule != "speedup" or best[i] > 1})
        rest = values[values < top]
        if len(best) == 1 and not rest.empty:
            found.update({(i, column): "second" for i in rest[rest == rest.max()].index
                          if rule != "speedup" or rest[i] > 1})
    return found


def marks_caption(table: pd.DataFrame, marks: Marks, best: str = "bold", second: str = "italics") -> str:
    """What the marks of `table` mean, in one sentence (for a table that has marks)."""
    levels = [level.replace("_", " ") for level in block_levels(table, marks)]
    within = f" among rows with the same {', '.join(levels)}" if levels else ""
    columns = [c for c in table.columns if marks.rule(c)]
    kinds = {rule: [c for c in columns if marks.rule(c) == rule] for rule in ("speedup", "lower")}
    parts = [f"{best.capitalize()}: the best value of its column{within}; {second}: the second best "
             "(AR rows and single rows unmarked; values compared at 2 decimals)"]
    if kinds["speedup"]:
        parts.append(f"{', '.join(kinds['speedup'])}: only a speedup above 1 is marked")
    if kinds["lower"]:
        parts.append(f"{', '.join(kinds['lower'])}: lower is better")
    return "; ".join(parts) + "."
