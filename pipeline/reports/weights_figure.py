"""The paper's Fig. 3: w(M) / (w(M) + w(T)) of a TABED ensemble per block, with the M-only (1),
T-only (0) and static MT (1/2) levels as reference lines and each block shaded by how many
proposals the target accepted; one panel per scenario category, one row of panels per pair.
The row each panel draws is chosen by `weight_ratio_rows`, from every row of a run or from
the candidates of its partition folders (`weight_candidates`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pipeline.reports.plots import (
    REFERENCES, legend, method_colour, pair_label, panel_label, panels, suptitle_target,
)
from pipeline.reports.report import grid_gammas, method_order


def weight_ratio_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One first-turn row of a TABED ensemble holding M and T (MT* first) per pair and
    category: the sample with the most blocks."""
    dynamic = _most_blocks_first(rows)
    if dynamic.empty:
        return dynamic
    label = sorted(dynamic["method_label"].unique(), key=lambda l: (l != "MT*", method_order(l)))[0]
    return dynamic[dynamic["method_label"] == label].groupby(WEIGHT_GROUPS, sort=True).head(1)


def weight_candidates(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows `weight_ratio_rows` may choose from, whichever label it takes: one per pair,
    category and method label. The candidates of several partition folders, one after another,
    hold its choice over their rows together."""
    groups = [*WEIGHT_GROUPS, "method_label"]
    return _most_blocks_first(rows).groupby(groups, sort=False, observed=True).head(1)


WEIGHT_GROUPS = ["target", "draft", "dtype", "category"]


def _most_blocks_first(rows: pd.DataFrame) -> pd.DataFrame:
    """First-turn rows of a TABED chain ensemble holding M and T, most blocks first (then by sample)."""
    # the paper's figure is of chains
    chain = rows["verify"].astype("str").fillna("chain") == "chain" if "verify" in rows else True
    dynamic = rows[rows["error"].isna() & (rows["turn"] == "first") & rows["method_label"].str.endswith("*")
                   & chain & rows["methods"].str.contains("M") & rows["methods"].str.contains("T")
                   & (rows["blocks"] > 1)]
    return dynamic.sort_values(["blocks", "sample_id"], ascending=[False, True])


def block_starts(accepted: list[int]) -> np.ndarray:
    """Decoding step at which each block starts: every block emits accepted + 1 tokens."""
    return np.concatenate([[0], np.cumsum(np.asarray(accepted) + 1)[:-1]]).astype(int)


def weight_ratio_figure(rows: pd.DataFrame, width: str = "two-column") -> tuple[Figure, str] | None:
    """Paper Fig. 3: w(M) / (w(M) + w(T)) per block of one sample per category and pair."""
    chosen = weight_ratio_rows(rows)
    if chosen.empty:
        return None
    pairs = list(dict.fromkeys(zip(chosen["target"], chosen["draft"], chosen["dtype"])))
    categories = sorted(chosen["category"].unique())
    fig, axes = panels(len(pairs), len(categories), width, panel_height=1.9)
    for ax in axes.flat:
        ax.set_visible(False)
    for _, row in chosen.iterrows():
        position = (pairs.index((row["target"], row["draft"], row["dtype"])) * len(categories)
                    + categories.index(row["category"]))
        ax = axes.flat[position]
        ax.set_visible(True)
        _draw_ratio(ax, row, panel_label((row["target"], row["draft"], row["dtype"]), pairs))
    first = chosen.iloc[0]
    fig.suptitle(f"{first['method_label']} ({first['policy']}): share of M in the ensemble weights"
                 f"{suptitle_target(pairs)}", fontsize=8)
    legend(fig, [ax for ax in axes.flat if ax.get_visible()], width)
    caption = (f"w(M)/(w(M)+w(T)) of {first['method_label']} ({first['policy']}) per block, one first-turn "
               "sample per scenario category (the one with the most blocks) and pair "
               f"({'; '.join(pair_label(*p) for p in pairs)}); gamma {grid_gammas(chosen)}; "
               "shading: proposals accepted in the block, darker = more.")
    return fig, caption


def _draw_ratio(ax, row: pd.Series, pair: str) -> None:
    accepted = list(row["accepted_per_block"])
    weights = np.asarray([list(w) for w in row["weights_per_block"]])
    m, t = row["methods"].index("M"), row["methods"].index("T")
    ratio = weights[:, m] / np.clip(weights[:, m] + weights[:, t], 1e-12, None)
    starts = block_starts(accepted)
    ends = starts + np.asarray(accepted) + 1
    gamma = max(int(row["gamma"]), 1)
    for start, end, n in zip(starts, ends, accepted):
        ax.axvspan(start, end, color="0.5", alpha=0.05 + 0.35 * n / gamma, lw=0)
    for name, level in REFERENCES.items():
        colour = method_colour({"M only": "M", "T only": "T", "static MT": "MT"}[name])
        ax.axhline(level, color=colour, lw=0.8, ls="--", label=name)
    ax.step(np.append(starts, ends[-1]), np.append(ratio, ratio[-1]), where="post",
            color=method_colour(row["method_label"]), lw=1.2, label=row["method_label"])
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{row['category']}: {row['sample_id']}\n{pair}, "
                 f"tau {row['tau']:.2f}", fontsize=6)
    ax.set_xlabel("decoding step", fontsize=6)
    ax.set_ylabel("w(M)/(w(M)+w(T))", fontsize=6)
    ax.tick_params(labelsize=6)
