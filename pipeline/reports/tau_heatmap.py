"""The tau figure: pooled block efficiency of every configuration on every dataset, as a heatmap
per pair and turn (a row per method label, a column per dataset, the value printed in its
cell). A grid of twenty configurations has no twenty colours a reader can tell apart in bars;
a row per configuration, named on its axis, scales to any number of them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.reports.plots import (
    PAGE_HEIGHT, WIDTHS, ordered_turns, pair_label, panel_label, suptitle_target, tau_cells,
)
from pipeline.reports.report import grid_gammas, method_order
from pipeline.reports.requests import Requests, requests_from

ROW_INCHES = {"two-column": 0.12, "one-column": 0.1}  # one method label's row
FONT = {"two-column": 5.5, "one-column": 4.5}
MIN_CELL_INCHES = 0.3  # a cell narrower than this cannot hold its value printed
CMAP = "viridis"
CHAR_EM = 0.6  # a label character's width, in ems of its font


def tau_figure(rows: pd.DataFrame | Requests, width: str = "two-column") -> tuple[Figure, str] | None:
    """A panel per pair (row of panels) and turn (column), one colour scale from tau = 1 (AR)
    to the run's highest; None without speculative rows."""
    requests = requests_from(rows)
    cells = tau_cells(requests, speculative_only=True)  # AR is tau = 1 by definition: the scale's floor
    if cells.empty:
        return None
    pairs = list(dict.fromkeys(zip(cells["target"], cells["draft"], cells["dtype"])))
    turns = ordered_turns(cells)
    labels = sorted(set(cells["method_label"]), key=method_order)
    top = max(float(cells["tau"].max()), 1.01)
    font = FONT[width]
    # a row per label, shrunk (with its text) where that would pass a page's height
    row = min(ROW_INCHES[width], (PAGE_HEIGHT - 1.0 - 0.45 * len(pairs)) / (len(pairs) * len(labels)))
    font = min(font, font * row / ROW_INCHES[width] + 1.0)
    # a panel at least as tall as its pair's label, written up its side, is long
    longest = max(len(line) for pair in pairs for line in panel_label(pair, pairs).splitlines())
    height = 1.0 + len(pairs) * max(0.45 + row * len(labels), 0.15 + longest * CHAR_EM * font / 72)
    fig = Figure(figsize=(WIDTHS[width], height))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(pairs), len(turns), squeeze=False, sharey=True)
    image = None
    widest = max(cells.groupby(["target", "draft", "dtype", "turn"])["dataset"].nunique())
    printed = WIDTHS[width] / (len(turns) * widest) >= MIN_CELL_INCHES  # else values would overlap
    for (row, pair), (column, turn) in [(p, t) for p in enumerate(pairs) for t in enumerate(turns)]:
        ax = axes[row, column]
        panel = cells[(cells[["target", "draft", "dtype"]] == pair).all(axis=1) & (cells["turn"] == turn)]
        datasets = sorted(set(panel["dataset"]), key=lambda d: (
            panel.loc[panel["dataset"] == d, "category"].iloc[0] != "benchmark", d))
        grid = (panel.pivot_table(index="method_label", columns="dataset", values="tau", aggfunc="first")
                .reindex(index=labels, columns=datasets))
        if panel.empty:  # a pair that decodes some turns alone (`timed: only`) has nothing here
            ax.text(0.5, 0.5, "not run on this turn", ha="center", va="center", fontsize=font,
                    transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_ylim(len(labels) - 0.5, -0.5)
        else:
            image = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap=CMAP, vmin=1.0, vmax=top,
                              interpolation="nearest")
            if printed:
                _print_values(ax, grid.to_numpy(dtype=float), top, font)
            ood = set(panel.loc[panel["category"] != "benchmark", "dataset"])
            names = [d.replace("embedded_", "") + (" (OOD)" if d in ood else "") for d in datasets]
            ax.set_xticks(range(len(datasets)), names, fontsize=font, rotation=30 if printed else 60,
                          ha="right")
        ax.set_yticks(range(len(labels)), labels, fontsize=font)
        ax.tick_params(length=0)
        if row == 0:  # a column per turn, a row per pair: each named once, so no titles collide
            ax.set_title(f"{turn} turn", fontsize=font)
        if column == 0:
            ax.set_ylabel(panel_label(pair, pairs), fontsize=font)
    gammas = grid_gammas(requests.cells)
    fig.suptitle(f"Block efficiency tau per configuration (gamma {gammas}){suptitle_target(pairs)}",
                 fontsize=font + 2)
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    bar = fig.colorbar(image, cax=fig.add_axes((0.9, 0.2, 0.015, 0.6)))
    bar.ax.tick_params(labelsize=font)
    bar.set_label("tau (1 = AR)", fontsize=font)
    caption = (f"Pooled block efficiency tau per configuration (row) and dataset (column); one panel per "
               f"pair and turn ({len(pairs)} pair(s): {'; '.join(pair_label(*p) for p in pairs)}); gamma "
               f"{gammas}; {int(cells['samples'].max())} samples per dataset at most. The colour scale "
               "starts at tau = 1, plain decoding (AR); a blank cell was not run."
               + ("" if printed else " Cells too narrow to print their values here: `tau.csv`, or the "
                  "two-column figure."))
    return fig, caption


def _print_values(ax, values: np.ndarray, top: float, font: float) -> None:
    """Each cell's tau in it, light on the dark half of the scale."""
    middle = 1.0 + (top - 1.0) / 2
    for (i, j), value in np.ndenumerate(values):
        if not np.isnan(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=font - 0.5,
                    color="white" if value < middle else "black")
