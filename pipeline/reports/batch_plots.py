"""The batch sweep's figure (`pipeline.reports.batch_sweep`): speedup over AR at the same batch
against the batch size, a line per configuration, a panel per pair; the calibration's
batch-aware Eq. 1 dashed beside it."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from pipeline.reports.plots import legend, pair_label, panel_label, panels, series_styles, suptitle_target
from pipeline.reports.report import method_order


def batch_figure(table: pd.DataFrame, width: str = "two-column") -> tuple[Figure, str] | None:
    """`table`: `batch_table`'s; None when it is empty. A panel per pair and temperature."""
    if table.empty:
        return None
    lines = table.reset_index()
    pairs = list(dict.fromkeys(zip(lines["target"], lines["draft"], lines["dtype"])))
    temperatures = sorted(set(lines["temperature"]))
    fig, axes = panels(len(temperatures), len(pairs), width, panel_height=2.2)
    styles = series_styles(sorted(set(lines["method_label"]), key=method_order))
    for row, temperature in enumerate(temperatures):
        for pair, ax in zip(pairs, axes[row]):
            panel = (*pair, temperature)
            mine = lines[(lines[["target", "draft", "dtype", "temperature"]] == panel).all(axis=1)]
            for (label, policy), line in sorted(mine.groupby(["method_label", "policy"], sort=False),
                                                key=lambda item: method_order(item[0][0])):
                line = line.sort_values("batch")
                colour, marker = styles[label]
                ax.plot(line["batch"], line["speedup"], marker=marker, ms=3, lw=1.2, color=colour,
                        label=label)
                if line["expected"].notna().any():
                    ax.plot(line["batch"], line["expected"], lw=0.8, ls="--", color=colour, alpha=0.6,
                            marker=marker, ms=3, mfc="none")
            ax.axhline(1.0, color="0.4", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(set(lines["batch"])), [str(b) for b in sorted(set(lines["batch"]))])
            ax.xaxis.set_minor_locator(NullLocator())
            sampled = "greedy" if temperature == 0 else f"sampled, T = {temperature:g}"
            ax.set_title(f"{panel_label(pair, pairs)}, {sampled}", fontsize=6)
            ax.set_xlabel("requests per batch", fontsize=6)
            ax.tick_params(labelsize=6)
        axes[row, 0].set_ylabel("speedup over AR at the same batch", fontsize=6)
    fig.suptitle(f"Where speculative decoding stops paying{suptitle_target(pairs)}", fontsize=8)
    legend(fig, axes.flat, width)
    caption = ("Measured speedup of SD over AR decoding the same requests in batches of the same size, "
               "at the same temperature (walltime of every batch summed), against the batch size; below the "
               "grey line SD costs more than it saves. Dashed, hollow marks: the speedup the calibration "
               "expects (Eq. 1 with the draft and verify costs measured at that batch size), where it was "
               "measured. A tree has its chain's colour and its own marker (square: candidates, triangle: "
               "dynamic, diamond: bandit). "
               f"Pairs: {'; '.join(pair_label(*p) for p in pairs)}.")
    return fig, caption
