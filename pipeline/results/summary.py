"""Write a run's reports next to its results: Markdown and CSV tables, PNG plots.

`OUT/_report-<run>/` (underscore: Parquet readers of OUT skip it): `summary.md` (tau per dataset, category averages, expected and measured
speedup, M vs T and where MT* lands, failed samples), one CSV per table, `tau.png` and `weights.png`.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.results.calibration import read_calibrations
from pipeline.results.plots import plot_tau_bars, plot_weight_trajectories
from pipeline.results.report import (
    category_table, error_counts, findings_text, markdown_table, method_findings, speedup_table, tau_table,
)


def write_summary(out: str | Path, run: str, rows: pd.DataFrame) -> str:
    """Write every table and plot of one run; return the Markdown that was written."""
    folder = Path(out) / f"_report-{run}"
    folder.mkdir(parents=True, exist_ok=True)
    tables = {
        "tau": ("Block efficiency tau per dataset (pooled over blocks; Avg. = benchmark datasets)", tau_table(rows)),
        "categories": ("Category averages (paper Table 2)", category_table(rows)),
        "speedup": (
            "Speedup: expected from tau and measured latency ratios (Eq. 1 and its CPU-corrected form), "
            "measured = AR walltime / SD walltime on the samples run live, per engine",
            speedup_table(rows, read_calibrations(out)),
        ),
    }
    sections = [f"# Run {run}: {len(rows)} rows, {rows['error'].notna().sum()} failed"]
    for name, (title, table) in tables.items():
        table.to_csv(folder / f"{name}.csv")
        sections.append(f"## {title}\n\n{markdown_table(table)}")
    findings = method_findings(rows)
    findings.to_csv(folder / "findings.csv")
    sections.append(
        "## M vs T, and where TABED lands (pooled tau; rank among the SD configurations run, 1 = best)\n\n"
        f"{findings_text(findings)}\n\n{markdown_table(findings, mark_best=False)}"
    )
    errors = error_counts(rows)
    if not errors.empty:
        lines = [f"| {r.dataset} | {r.turn} | {r.errors} |" for r in errors.itertuples()]
        sections.append("## Failed samples (left out of every table)\n\n| dataset | turn | errors |\n|---|---|---|\n" + "\n".join(lines))
    plots = [plot_tau_bars(rows, folder / "tau.png"), plot_weight_trajectories(rows, folder / "weights.png")]
    sections.append("## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots if p is not None))
    text = "\n\n".join(sections) + "\n"
    (folder / "summary.md").write_text(text)
    return text
