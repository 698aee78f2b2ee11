"""The summary's calibration section: the calibration each expected speedup used, its verify
curve and its step cost against the prompt's length, as tables, CSVs and figures."""
from __future__ import annotations

from pathlib import Path

from pipeline.reports.plots import context_cost_figure, save, verify_cost_figure
from pipeline.reports.report import markdown_table
from pipeline.storage.calibration_store import Calibrations


def calibration_section(calibrations: Calibrations, folder: Path) -> str:
    """The calibration each expected speedup used: ratios as median [min-max] over rounds."""
    table = calibrations.table()
    if table.empty:
        return ""
    table.to_csv(folder / "calibration.csv")
    text = ("## Calibration used (latency ratios, median [min-max] over rounds; "
            "the latest per pair and dtype)\n\n"
            + markdown_table(table))
    curves = calibrations.verify_curves()
    made = verify_cost_figure(curves)
    if made is not None:
        curves.to_csv(folder / "verify_cost.csv", index=False)
        save(made[0], folder / "verify_cost")
        text += f"\n\n![verify cost](verify_cost.png)\n\n> {made[1]}"
    costs = calibrations.context_costs()
    made = context_cost_figure(costs)
    if made is not None:
        costs.to_csv(folder / "context_cost.csv", index=False)
        save(made[0], folder / "context_cost")
        by_context = costs.set_index(["target", "draft", "dtype", "device", "context"])
        text += ("\n\n### Step cost against the prompt's length "
                 "(calibration: one row, after a text prompt of each length)"
                 f"\n\n{markdown_table(by_context)}"
                 f"\n\n![context cost](context_cost.png)\n\n> {made[1]}")
    return text
