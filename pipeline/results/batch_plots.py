"""The batch sweep's figure (`pipeline.results.batch_sweep`): speedup over AR at the same batch
against the batch size, a line per configuration, a panel per pair; the calibration's
batch-aware Eq. 1 dashed beside it."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from pipeline.results.plots import legend, method_colour, pair_label, panel_label, panels, suptitle_target
from pipeline.results.report import method_order


def batch_figure(table: pd.DataFrame, width: str = "two-column") -> tuple[Figure, str] | None:
    """`table`: `batch_table`'s; None when it is empty."""
    if table.empty:
        return None
    lines = table.reset_index()
    pairs = list(dict.fromkeys(zip(lines["target"], lines["draft"], lines["dtype"])))
    fig, axes = panels(1, len(pairs), width, panel_height=2.2)
    for pair, ax in zip(pairs, axes.flat):
        mine = lines[(lines["target"] == pair[0]) & (lines["draft"] == pair[1]) & (lines["dtype"] == pair[2])]
        for (label, policy), line in sorted(mine.groupby(["method_label", "policy"], sort=False),
                                            key=lambda item: method_order(item[0][0])):
            line = line.sort_values("batch")
            colour = method_colour(label)
            ax.plot(line["batch"], line["speedup"], marker="o", ms=3, lw=1.2, color=colour, label=label,
                    ls=":" if "(" in label else "-")
            if line["expected"].notna().any():
                ax.plot(line["batch"], line["expected"], lw=0.8, ls="--", color=colour, alpha=0.6)
        ax.axhline(1.0, color="0.4", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(lines["batch"])), [str(b) for b in sorted(set(lines["batch"]))])
        ax.set_title(panel_label(pair, pairs), fontsize=6)
        ax.set_xlabel("requests per batch", fontsize=6)
        ax.tick_params(labelsize=6)
    axes[0, 0].set_ylabel("speedup over AR at the same batch", fontsize=6)
    fig.suptitle(f"Where speculative decoding stops paying{suptitle_target(pairs)}", fontsize=8)
    legend(fig, axes.flat[0], width)
    caption = ("Measured speedup of greedy SD over AR decoding the same requests in batches of the same size "
               "(walltime of every batch summed), against the batch size; below the grey line SD costs more than "
               "it saves. Dashed: the speedup the calibration expects (Eq. 1 with the draft and verify costs "
               "measured at that batch size), where it was measured. Dotted lines are candidate trees. Pairs: "
               f"{'; '.join(pair_label(*p) for p in pairs)}.")
    return fig, caption
