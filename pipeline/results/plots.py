"""Paper-style figures from the results dataset (matplotlib, PNG, no display needed).

- `plot_weight_trajectories`: w* per block over decoding steps, each block shaded by how many
  proposals the target accepted (paper Fig. 3).
- `plot_tau_bars`: pooled block efficiency per drafting method for each dataset.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pipeline.results.report import method_order, pooled_tau  # noqa: E402

METHOD_COLOURS = {"M": "tab:blue", "T": "tab:orange", "C": "tab:green", "P": "tab:red"}


def block_starts(accepted: list[int]) -> np.ndarray:
    """Decoding step at which each block starts: every block emits accepted + 1 tokens."""
    return np.concatenate([[0], np.cumsum(np.asarray(accepted) + 1)[:-1]]).astype(int)


def plot_weight_trajectories(df: pd.DataFrame, path: str | Path, max_samples: int = 4) -> Path | None:
    """One panel per sample of the first dynamic-policy configuration found (None if none)."""
    dynamic = df[(df["error"].isna()) & df["method_label"].str.endswith("*") & (df["blocks"] > 1)]
    dynamic = dynamic[dynamic["weights_per_block"].map(len) == dynamic["blocks"]]
    if dynamic.empty:
        return None
    label = sorted(dynamic["method_label"].unique(), key=method_order)[0]
    rows = dynamic[dynamic["method_label"] == label].sort_values("sample_id").head(max_samples)
    fig, axes = plt.subplots(len(rows), 1, figsize=(9, 2.2 * len(rows)), sharex=True, squeeze=False)
    for ax, (_, row) in zip(axes[:, 0], rows.iterrows()):
        accepted = list(row["accepted_per_block"])
        weights = np.asarray([list(w) for w in row["weights_per_block"]])
        starts = block_starts(accepted)
        ends = starts + np.asarray(accepted) + 1
        gamma = max(int(row["gamma"]), 1)
        for start, end, n in zip(starts, ends, accepted):
            ax.axvspan(start, end, color="0.5", alpha=0.08 + 0.4 * n / gamma, lw=0)
        for i, letter in enumerate(row["methods"]):
            steps = np.append(starts, ends[-1])  # repeat the last weight to the end of its block
            ax.step(steps, np.append(weights[:, i], weights[-1, i]), where="post",
                    color=METHOD_COLOURS.get(letter), label=f"w[{letter}]")
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("w*")
        ax.set_title(f"{row['sample_id']}  tau={row['tau']:.2f}", fontsize=9, loc="left")
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=len(rows.iloc[0]["methods"]))
    axes[-1, 0].set_xlabel("decoding step (shading: proposals accepted in the block, darker = more)")
    fig.suptitle(f"{label}: ensemble weights per block ({rows.iloc[0]['policy']})")
    fig.tight_layout()
    return _save(fig, path)


def plot_tau_bars(df: pd.DataFrame, path: str | Path) -> Path | None:
    """Grouped bars: pooled tau of each method label per dataset and turn."""
    ok = df[df["error"].isna()]
    if ok.empty:
        return None
    ok = ok.assign(group=ok["dataset"] + np.where(ok["turn"] == "first", "", " / " + ok["turn"]))
    table = ok.groupby(["group", "method_label"]).apply(pooled_tau, include_groups=False).unstack("method_label")
    table = table[sorted(table.columns, key=method_order)]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(table) * max(1, len(table.columns)) / 4), 4))
    table.plot.bar(ax=ax, width=0.85)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("block efficiency tau")
    ax.set_xlabel("")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
