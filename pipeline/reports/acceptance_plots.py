"""Figures of acceptance beyond the pooled tau (`pipeline.reports.acceptance`): acceptance by
draft position, and tau per request. One panel per pair and turn, as the tau figure has."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pipeline.reports.plots import (
    legend, method_colour, ordered_turns, pair_label, panel_label, panels, series_styles, suptitle_target,
)
from pipeline.reports.report import method_order


def _facets(table: pd.DataFrame, width: str, panel_height: float):
    """A figure with a panel per pair and turn: (figure, axes, pairs, method labels, and per
    panel its axes and rows), each panel titled."""
    # distinct values, never a Python string per row: a request table has one line per request
    pairs = list(table[["target", "draft", "dtype"]].drop_duplicates().itertuples(index=False, name=None))
    turns = ordered_turns(table)
    fig, axes = panels(len(pairs), len(turns), width, panel_height=panel_height)
    cells = []
    for (pair, turn), ax in zip([(p, t) for p in pairs for t in turns], axes.flat):
        mine = (table["target"] == pair[0]) & (table["draft"] == pair[1]) & (table["dtype"] == pair[2])
        cells.append((ax, table[mine & (table["turn"] == turn)]))
        ax.set_title(f"{panel_label(pair, pairs)}\n{turn} turn", fontsize=6)
    return fig, axes, pairs, sorted(table["method_label"].unique(), key=method_order), cells


def per_position_figure(table: pd.DataFrame, width: str = "two-column") -> tuple[Figure, str] | None:
    """Pooled conditional acceptance against draft position, a line per method verified as a chain."""
    table = table[~table["method_label"].str.contains(" (", regex=False)]  # chains: trees are in the CSV
    if table.empty:
        return None
    fig, axes, pairs, labels, cells = _facets(table, width, 1.9)
    styles = series_styles(labels)
    for ax, panel in cells:
        for label in labels:
            line = panel[panel["method_label"] == label]
            if len(line):
                ax.plot(line["position"], line["acceptance"], marker=styles[label][1], lw=1, ms=2.5,
                        color=styles[label][0], label=label)
        ax.set_ylim(0, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # positions are whole numbers
        ax.tick_params(labelsize=6)
        ax.set_xlabel("draft position", fontsize=6)
    for ax in axes[:, 0]:
        ax.set_ylabel("P(accept | reached)", fontsize=7)
    fig.suptitle(f"Acceptance by draft position{suptitle_target(pairs)}", fontsize=8)
    legend(fig, axes.flat, width)
    caption = ("Conditional acceptance at each draft position of a chain (blocks that accepted it among "
               "those that reached it), pooled over blocks; a row's last block counts only up to what it "
               "accepted (EOS or the budget may have cut it); token trees' positions are in "
               f"per_position.csv. Pairs: {'; '.join(pair_label(*p) for p in pairs)}.")
    return fig, caption


def request_tau_figure(taus: pd.DataFrame, width: str = "two-column") -> tuple[Figure, str] | None:
    """tau of each request as a box per method: the spread a pooled tau hides."""
    if taus.empty:
        return None
    fig, axes, pairs, labels, cells = _facets(taus, width, 2.1)
    for ax, panel in cells:
        shown = [label for label in labels if (panel["method_label"] == label).any()]
        boxes = ax.boxplot([panel.loc[panel["method_label"] == label, "tau"] for label in shown], widths=0.6,
                           patch_artist=True, flierprops={"markersize": 2}, medianprops={"color": "black"})
        for patch, label in zip(boxes["boxes"], shown):
            patch.set_facecolor(method_colour(label))
        ax.set_xticks(range(1, len(shown) + 1), shown, rotation=60, ha="right", fontsize=5)
        ax.tick_params(axis="y", labelsize=6)
    for ax in axes[:, 0]:
        ax.set_ylabel("tau per request", fontsize=7)
    fig.suptitle(f"Block efficiency per request{suptitle_target(pairs)}", fontsize=8)
    fig.tight_layout()
    caption = ("tau (accepted + 1 per block) of each request, per method: boxes span the quartiles, "
               "whiskers 1.5 IQR, dots the requests beyond. Pairs: "
               f"{'; '.join(pair_label(*p) for p in pairs)}.")
    return fig, caption
