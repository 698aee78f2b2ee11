"""Paper figures from the results dataset (matplotlib; PNG, PDF and SVG of each), and what
every figure shares: widths, panels, the legend, method colours, saving.

- `tau_cells`: pooled block efficiency per pair, turn, dataset and method label, which the tau
  heatmap (`pipeline.reports.tau_heatmap`) draws. Rows of different pairs are never pooled.
- `weight_ratio_figure`: the paper's Fig. 3. It draws w(M) / (w(M) + w(T)) of a TABED ensemble
  per block, with the M-only (1), T-only (0) and static MT (1/2) levels as reference lines
  and each block shaded by how many proposals the target accepted. There is one panel per
  scenario category, one row of panels per pair.

Every method label has one colour in every figure (`method_colour`). Sizes follow a paper's
column widths (`WIDTHS`). Each figure function returns a matplotlib `Figure` and a caption
that states pair, dtype, gamma and sample counts; `save` writes it. Figures are made without
pyplot, so reports need no display and a notebook shows them inline as they are.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullLocator

from pipeline.reports.pooling import BLOCKS, pooled_taus, present
from pipeline.reports.report import VARYING, configuration_labels, grid_gammas, method_order

WIDTHS = {"one-column": 3.5, "two-column": 7.16}  # inches: a two-column paper's column and page width
PAGE_HEIGHT = 9.0  # inches: a page's text height (US letter or A4 with 1-inch margins)
FIGURE_MARGINS = 1.2  # inches of a panel figure outside its panels: title and legend
FORMATS = ("png", "pdf", "svg")
# one colour per method label, the same in every figure; others get a stable one of tab20
METHOD_COLOURS = {
    "AR": "#7f7f7f", "M": "#1f77b4", "T": "#ff7f0e", "C": "#2ca02c", "P": "#d62728", "MT": "#9467bd",
    "MT*": "#e377c2", "MTCP": "#8c564b", "MTCP*": "#17becf", "MTP": "#bcbd22", "MTP*": "#aec7e8",
}
REFERENCES = {"M only": 1.0, "static MT": 0.5, "T only": 0.0}


# a tree's marker beside its chain's colour: MT*'s candidate, dynamic and bandit trees are MT*'s colour
KIND_MARKERS = {"chain": "o", "candidates": "s", "dynamic": "^", "bandit": "D", "shape": "v"}
SPARE_MARKERS = ("P", "X", "*", "h", "<", ">", "p", "d")


def method_colour(label: str) -> str:
    if label in METHOD_COLOURS:
        return METHOD_COLOURS[label]
    palette = matplotlib.colormaps["tab20"].colors
    return palette[sum(map(ord, label)) % len(palette)]


def series_styles(labels: list[str]) -> dict[str, tuple[str, str]]:
    """(colour, marker) per method label, no two alike: a chain its method's colour and a circle,
    a tree its chain's colour and its kind's marker (`MT* (candidates)`: MT*'s colour, a square);
    a method without a colour of its own takes the next unused one of tab20, and a second tree of
    one kind (other knobs) the next spare marker."""
    palette = [matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab20"].colors]
    bases = list(dict.fromkeys(label.partition(" (")[0] for label in labels))
    colours = {base: METHOD_COLOURS[base] for base in bases if base in METHOD_COLOURS}
    spare = iter(c for c in palette if c not in set(colours.values()))
    colours |= {base: next(spare, "#000000") for base in bases if base not in colours}
    styles: dict[str, tuple[str, str]] = {}
    for label in labels:
        base, _, tree = label.partition(" (")
        kind = tree.split("(")[0].rstrip(")") if tree else "chain"
        options = [KIND_MARKERS.get(kind, SPARE_MARKERS[0]), *SPARE_MARKERS]
        taken = set(styles.values())
        styles[label] = next(((colours[base], m) for m in options if (colours[base], m) not in taken),
                             (colours[base], options[0]))
    return styles


def pair_label(target: str, draft: str, dtype: str) -> str:
    return f"{target} <- {draft} ({dtype})"


def panel_label(pair: tuple[str, str, str], pairs: list[tuple[str, str, str]]) -> str:
    """A panel's pair, short: `<- draft (dtype)` when every panel has one target (the
    suptitle names it), else the target above it, so labels of neighbouring panels never run
    into each other."""
    target, draft, dtype = pair
    return f"<- {draft} ({dtype})" if len({p[0] for p in pairs}) == 1 else f"{target}\n<- {draft} ({dtype})"


def suptitle_target(pairs: list[tuple[str, str, str]]) -> str:
    targets = sorted({p[0] for p in pairs})
    return f"\ntarget {targets[0]}" if len(targets) == 1 else ""


def tau_cells(rows: pd.DataFrame, speculative_only: bool = False) -> pd.DataFrame:
    """What the tau heatmap draws: pooled tau and sample count per pair, dtype, turn, dataset and
    method label (AR's rows left out first where `speculative_only`). Every cell holds the rows of
    one pair only."""
    keys = ["target", "draft", "dtype", "turn", "category", "dataset", "method_label"]
    read = [*keys, *VARYING, "verify", "verify_shapes", "sample_id", *BLOCKS]  # the copy: what the cells read
    kept = rows["error"].isna() & (rows["method_label"] != "AR") if speculative_only else rows["error"].isna()
    ok = rows.loc[kept, present(rows, read)]
    if ok.empty:  # every speculative row failed
        return pd.DataFrame(columns=[*keys, "tau", "samples"])
    ok = ok.assign(method_label=configuration_labels(ok, keys[:-1]))
    grouped = ok.groupby(keys, sort=False)
    cells = pooled_taus(ok, keys).rename("tau").to_frame()
    return cells.join(grouped["sample_id"].nunique().rename("samples")).reset_index()


def ordered_turns(cells: pd.DataFrame) -> list[str]:
    return sorted(cells["turn"].unique(), key=lambda turn: (turn != "first", turn))


def weight_ratio_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One first-turn row of a TABED ensemble holding M and T (MT* first) per pair and
    category: the sample with the most blocks."""
    # the paper's figure is of chains
    chain = rows["verify"].astype("str").fillna("chain") == "chain" if "verify" in rows else True
    dynamic = rows[rows["error"].isna() & (rows["turn"] == "first") & rows["method_label"].str.endswith("*")
                   & chain & rows["methods"].str.contains("M") & rows["methods"].str.contains("T")
                   & (rows["blocks"] > 1)]
    if dynamic.empty:
        return dynamic
    label = sorted(dynamic["method_label"].unique(), key=lambda l: (l != "MT*", method_order(l)))[0]
    chosen = dynamic[dynamic["method_label"] == label].sort_values(
        ["blocks", "sample_id"], ascending=[False, True])
    return chosen.groupby(["target", "draft", "dtype", "category"], sort=True).head(1)


def panels(rows: int, columns: int, width: str, panel_height: float) -> tuple[Figure, np.ndarray]:
    """A figure of rows x columns panels (row-major in `axes.flat`) at a paper's `width`; at
    one column's width the panels stack in one column, shrunk to keep the figure a page tall."""
    if width == "one-column":
        rows, columns = rows * columns, 1
        panel_height = min(panel_height, (PAGE_HEIGHT - FIGURE_MARGINS) / rows)
    fig = Figure(figsize=(WIDTHS[width], FIGURE_MARGINS + panel_height * rows))
    FigureCanvasAgg(fig)  # a renderer to measure text with (the legend's width) before saving
    return fig, fig.subplots(rows, columns, squeeze=False, sharey=True)


def legend(fig: Figure, ax, width: str) -> None:
    """One legend for all panels, under them, in as many columns as fit the figure's width
    (measured, not guessed: tree labels such as `MTCP* (candidates)` are long); then lay out
    (after the title is set, so the layout leaves room for it)."""
    handles, names = ax.get_legend_handles_labels()
    renderer = fig.canvas.get_renderer()
    for columns in range(min(len(names), 9), 0, -1):
        made = fig.legend(handles, names, loc="lower center", ncol=columns, fontsize=6, frameon=False)
        if made.get_window_extent(renderer).width <= fig.bbox.width * 0.98 or columns == 1:
            break
        made.remove()
    legend_inches = made.get_window_extent(renderer).height / fig.dpi + 0.05
    fig.tight_layout(rect=(0, legend_inches / fig.get_figheight(), 1, 1))


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
    legend(fig, next(ax for ax in axes.flat if ax.get_visible()), width)
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


def verify_cost_figure(curves: pd.DataFrame, width: str = "one-column") -> tuple[Figure, str] | None:
    """The verify-latency curve: one target forward over n tokens against one cached step,
    per target, dtype and device (`Calibrations.verify_curves`); None with < 2 points."""
    if curves.empty or curves.groupby(["target", "dtype", "device"]).size().max() < 2:
        return None
    fig = Figure(figsize=(WIDTHS[width], 2.4))
    ax = fig.subplots()
    for (target, dtype, device), curve in curves.groupby(["target", "dtype", "device"], sort=True):
        curve = curve.sort_values("tokens")
        low = curve["low"] if "low" in curve else curve["ratio"]
        high = curve["high"] if "high" in curve else curve["ratio"]
        spread = [(curve["ratio"] - low).fillna(0).clip(lower=0),
                  (high - curve["ratio"]).fillna(0).clip(lower=0)]
        ax.errorbar(curve["tokens"], curve["ratio"], yerr=spread, marker="o", ms=3, lw=1.2, capsize=2,
                    label=f"{target} ({dtype}), {device}")
    ax.axhline(1.0, color="0.5", lw=0.8, ls="--", label="one step (what Eq. 1 assumes)")
    _label_single(fig, ax, "tokens in one target forward (chain: gamma + 1; tree: nodes + 1)",
                  "Tp(n) / Tp(1)")
    caption = ("Verify cost against tokens verified in one target forward, measured by calibration "
               "(median over rounds; bars: the lowest and highest round): what a chain of gamma proposals "
               "or a tree of n nodes costs the target, relative to one step. Where the bars are long, the "
               "machine was busy and the curve is noise.")
    return fig, caption


def context_cost_figure(costs: pd.DataFrame, width: str = "one-column") -> tuple[Figure, str] | None:
    """One cached draft step (and the target's, dashed) against the prompt's length, from
    calibration (`Calibrations.context_costs`): an attention draft's grows with the
    context, a state-space draft's should stay flat. None without two lengths."""
    if costs.empty or costs["context"].nunique() < 2:
        return None
    fig = Figure(figsize=(WIDTHS[width], 2.6))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    colours = iter(matplotlib.colormaps["tab10"].colors)
    for k, ((target, dtype), pairs) in enumerate(costs.groupby(["target", "dtype"], sort=True)):
        first = pairs[pairs["draft"] == pairs["draft"].iloc[0]].sort_values("context")
        ax.plot(first["context"], first["Tp ms"], color=str(0.2 + 0.15 * (k % 4)), ls="--",
                marker=SPARE_MARKERS[k % len(SPARE_MARKERS)], ms=3, lw=1, label=f"target {target} ({dtype})")
        for draft, curve in pairs.groupby("draft", sort=True):
            curve = curve.sort_values("context")
            ax.plot(curve["context"], curve["Tq ms"], marker="o", ms=3, lw=1.2, color=next(colours, "k"),
                    label=f"draft {draft} ({dtype})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    # plain numbers, small: a log axis otherwise labels its minor ticks large and overlapping
    contexts = sorted(costs["context"].unique())
    ax.set_xticks(contexts, [str(int(c)) for c in contexts])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    for formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        formatter(FormatStrFormatter("%g"))
    ax.tick_params(which="minor", labelsize=5)
    _label_single(fig, ax, "prompt tokens before the step", "one cached step, ms")
    caption = ("One cached decoding step (one row, median over the calibration's rounds) after text "
               "prompts of several lengths: an attention draft reads a KV cache as long as the prompt, a "
               "state-space draft a state of fixed size. The target's step is dashed.")
    return fig, caption


def _label_single(fig: Figure, ax, xlabel: str, ylabel: str) -> None:
    """Axis labels, small ticks and a frameless legend for a one-panel calibration figure; lay out."""
    ax.set_xlabel(xlabel, fontsize=6)
    ax.set_ylabel(ylabel, fontsize=6)
    ax.tick_params(labelsize=6)
    ax.legend(fontsize=5, frameon=False)
    fig.tight_layout()


def save(fig: Figure, stem: str | Path) -> list[Path]:
    """`stem`.png (200 dpi), .pdf and .svg."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(f".{fmt}") for fmt in FORMATS]
    for path in paths:
        fig.savefig(path, dpi=200)
    return paths
