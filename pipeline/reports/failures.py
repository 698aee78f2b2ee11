"""What failed and why, in a report: the failed-samples section of every summary, and the whole
report of a run none of whose rows decoded (every other table would be empty)."""
from __future__ import annotations

import pandas as pd

from pipeline.reports.report import error_counts, escaped, without_html


def failures_report(run: str, count: int, failed: pd.DataFrame, completeness: str) -> str:
    """summary.md of a run whose every row (`count` of them) failed: what was expected
    (`completeness`, its section), what failed and the most frequent causes, which is what its
    reader needs (`failed`: the rows, the failed ones at least)."""
    failed = failed[failed["error"].notna()]
    causes = failed.groupby("error", dropna=False).size().sort_values(ascending=False).head(10)
    lines = "\n".join(f"| {escaped(str(cause))[:200]} | {count} |" for cause, count in causes.items())
    sections = [f"# Run {run}: {count} rows, every one failed",
                "No row decoded, so there is no table of tau, speedup or acceptance; the causes below "
                "(`error` and `error_category` of each row in the results) say what to fix, and a rerun "
                "of the same command recomputes the failed rows.",
                completeness, failed_section(failed),
                f"## Most frequent causes\n\n| error | rows |\n|---|---|\n{lines}"]
    return without_html("\n\n".join(sections) + "\n")


def failed_section(everything: pd.DataFrame) -> str:
    """Failed rows per dataset and turn ("" when none failed)."""
    errors = error_counts(everything)
    if errors.empty:
        return ""
    lines = [f"| {escaped(r.dataset)} | {escaped(r.turn)} | {r.errors} |" for r in errors.itertuples()]
    return ("## Failed samples (left out of every table)\n\n"
            "| dataset | turn | errors |\n|---|---|---|\n" + "\n".join(lines))
