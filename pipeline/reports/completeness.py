"""Is a run complete? Expected rows (from the manifest the runner writes when a run starts)
against the rows present and failed, per pair, dtype and turn, so a run that stopped early can
never pass for a finished one."""
from __future__ import annotations

import pandas as pd

KEYS = ["target", "draft", "dtype", "turn"]
RESUME = ("rerun the same `jobs/full_grid.py` command (same --grid, --out and --run) to resume; "
          "rows already written are kept")


def completeness_table(rows: pd.DataFrame, expected: list[dict] | None) -> pd.DataFrame:
    """expected / present / failed / missing rows per target, draft, dtype and turn, of rows or
    of cells of rows (`pipeline.reports.cells`: each counts its `rows`)."""
    counts = rows["rows"].to_numpy() if "rows" in rows else 1
    present = (rows[KEYS].assign(present=counts, failed=rows["error"].notna().to_numpy() * counts)
               .groupby(KEYS, observed=True)[["present", "failed"]].sum())
    if expected:
        wanted = pd.DataFrame(expected).groupby(KEYS)["rows"].sum().rename("expected")
        table = pd.concat([wanted, present], axis=1).fillna(0).astype(int)
    else:
        table = present.assign(expected=pd.NA)
    table["missing"] = (table["expected"] - table["present"]).clip(lower=0) if expected else pd.NA
    return table[["expected", "present", "failed", "missing"]]


def completeness_text(table: pd.DataFrame, expected: list[dict] | None, writer: dict | None = None) -> str:
    """`writer`: the lock holder ({host, pid, since}) when a driver is writing the run now."""
    if not expected:
        return ("No run manifest was found, so the expected number of rows is unknown "
                "(a run written before manifests).")
    missing, total, failed = (int(table["missing"].sum()), int(table["expected"].sum()),
                              int(table["failed"].sum()))
    beyond = int((table["present"] - table["expected"]).clip(lower=0).sum())
    extra = (f" **{beyond} rows present belong to no grid recorded for this run** (written before its "
             "manifest kept every grid, or by hand).") if beyond else ""
    if missing and writer:
        return (f"**INCOMPLETE: {missing} of {total} expected rows are missing.** A driver is writing this "
                f"run now (pid {writer.get('pid')} on {writer.get('host')}, since {writer.get('since')}): "
                f"summarize again once it ends; if it stops before finishing, {RESUME}.{extra}")
    if missing:
        return (f"**INCOMPLETE: {missing} of {total} expected rows are missing.** "
                f"To finish it, {RESUME}.{extra}")
    failures = f"{failed} of them record a failure, listed below" if failed else "none failed"
    return f"Complete: all {total} expected rows are present ({failures}).{extra}"


def grids_text(grids: list) -> str:
    """The grids a run's expected rows are the union of (`pipeline.storage.manifest`), when several."""
    if len(grids) < 2:
        return ""
    listed = "; ".join(f"{g.name} ({g.rows} rows{', first run ' + g.written_at if g.written_at else ''})"
                       for g in grids)
    return f" Expected rows are the union of the {len(grids)} grids written into this run: {listed}."
