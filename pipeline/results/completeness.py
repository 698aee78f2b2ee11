"""Is a run complete? Expected rows (from the manifest the runner writes when a run starts)
against the rows present and failed, per pair, dtype and turn, so a run that stopped early can
never pass for a finished one."""
from __future__ import annotations

import pandas as pd

KEYS = ["target", "draft", "dtype", "turn"]
RESUME = "rerun the same `jobs/full_grid.py` command (same --grid, --out and --run) to resume; rows already written are kept"


def completeness_table(rows: pd.DataFrame, expected: list[dict] | None) -> pd.DataFrame:
    """expected / present / failed / missing rows per target, draft, dtype and turn."""
    present = rows.groupby(KEYS).agg(present=("key", "size"), failed=("error", lambda e: int(e.notna().sum())))
    if expected:
        wanted = pd.DataFrame(expected).groupby(KEYS)["rows"].sum().rename("expected")
        table = pd.concat([wanted, present], axis=1).fillna(0).astype(int)
    else:
        table = present.assign(expected=pd.NA)
    table["missing"] = (table["expected"] - table["present"]).clip(lower=0) if expected else pd.NA
    return table[["expected", "present", "failed", "missing"]]


def completeness_text(table: pd.DataFrame, expected: list[dict] | None) -> str:
    if not expected:
        return "No run manifest was found, so the expected number of rows is unknown (a run written before manifests)."
    missing, total, failed = int(table["missing"].sum()), int(table["expected"].sum()), int(table["failed"].sum())
    if missing:
        return f"**INCOMPLETE: {missing} of {total} expected rows are missing.** To finish it, {RESUME}."
    failures = f"{failed} of them record a failure, listed below" if failed else "none failed"
    return f"Complete: all {total} expected rows are present ({failures})."
