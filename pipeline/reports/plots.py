"""Paper figures from the results dataset (matplotlib; PNG, PDF and SVG of each), and what
every figure shares: widths, panels, the legend, method colours, saving.

- `tau_cells`: pooled block efficiency per pair, turn, dataset and method label, which the tau
  heatmap (`pipeline.reports.tau_heatmap`) draws. Rows of different pairs are never pooled.
- the paper's Fig. 3, TABED's weights per block: `pipeline.reports.weights_figure`.

Every method label has one colour in every figure (`method_colour`). Sizes follow a paper's
column widths (`WIDTHS`). Each figure function returns a matplotlib `Figure` and a caption
that states pair, dtype, gamma and sample counts; `save` writes it. Figures are made without
pyplot, so reports need no display and a notebook shows them inline as they are.
"""
from __future__ import annotations

import re

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullLocator

from pipeline.reports.pooling import pooled_taus
from pipeline.reports.report import configuration_labels
from pipeline.reports.requests import Requests, requests_from

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
KIND_MARKERS = {"chain": "o", "candidates": "s", "dynamic": "^", "bandit": "D", "shape": "v", "template": "h",
                "eagle2": "p"}
SPARE_MARKERS = ("P", "X", "*", "<", ">", "d")


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
    label = wrapped(f"<- {draft} ({dtype})")
    return label if len({p[0] for p in pairs}) == 1 else f"{target}\n{label}"


LABEL_CHARS = 24  # a panel label's line: about a small panel's height in the figures' fonts


def wrapped(label: str, width: int = LABEL_CHARS) -> str:
    """`label` on lines of about `width` characters, broken after `,` or `+` or before `(` (a
    lookup's hyperparameters, an ensemble's drafters), so a long draft name stays beside its panel."""
    lines = [""]
    for piece in re.findall(r"\(?[^,+(]*[,+]?", label):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(line.strip() for line in lines if line.strip())


def suptitle_target(pairs: list[tuple[str, str, str]]) -> str:
    targets = sorted({p[0] for p in pairs})
    return f"\ntarget {targets[0]}" if len(targets) == 1 else ""


def tau_cells(source: pd.DataFrame | Requests, speculative_only: bool = False) -> pd.DataFrame:
    """What the tau heatmap draws: pooled tau and sample count per pair, dtype, turn, dataset and
    method label (AR's rows left out first where `speculative_only`). Every cell holds the rows of
    one pair only."""
    keys = ["target", "draft", "dtype", "turn", "category", "dataset", "method_label"]
    requests = requests_from(source)
    cells = requests.cells
    kept = cells["error"].isna() & ((cells["method_label"] != "AR") if speculative_only else True)
    ok = cells[kept]
    if ok.empty:  # every speculative row failed
        return pd.DataFrame(columns=[*keys, "tau", "samples"])
    ok = ok.assign(method_label=configuration_labels(ok, keys[:-1]))
    taus = pooled_taus(ok, keys).rename("tau").to_frame()
    return taus.join(_samples(ok, keys, requests.rows)).reset_index()


def _samples(cells: pd.DataFrame, keys: list[str], rows: pd.DataFrame) -> pd.Series:
    """Distinct samples among `rows` (`Requests.rows`) of each group of `cells` by `keys`, from
    numbers: a group number per row and a sample number per row, each pair counted once."""
    grouped = cells.groupby(keys, sort=False, observed=True)
    group_of = np.nan_to_num(grouped.ngroup().to_numpy(dtype=float), nan=-1).astype(np.int64)
    line = cells.index.get_indexer(rows["cell"].to_numpy())
    group = np.where(line >= 0, group_of[line], -1)
    sample, names = pd.factorize(rows["sample_id"])
    kept = (group >= 0) & (sample >= 0)
    pairs = np.unique(group[kept] * max(len(names), 1) + sample[kept])
    counts = np.bincount(pairs // max(len(names), 1), minlength=grouped.ngroups)
    return pd.Series(counts, index=grouped.size().index, name="samples")


def ordered_turns(cells: pd.DataFrame) -> list[str]:
    return sorted(cells["turn"].unique(), key=lambda turn: (turn != "first", turn))


def panels(rows: int, columns: int, width: str, panel_height: float) -> tuple[Figure, np.ndarray]:
    """A figure of rows x columns panels (row-major in `axes.flat`) at a paper's `width`; at
    one column's width the panels stack in one column, shrunk to keep the figure a page tall."""
    if width == "one-column":
        rows, columns = rows * columns, 1
        panel_height = min(panel_height, (PAGE_HEIGHT - FIGURE_MARGINS) / rows)
    fig = Figure(figsize=(WIDTHS[width], FIGURE_MARGINS + panel_height * rows))
    FigureCanvasAgg(fig)  # a renderer to measure text with (the legend's width) before saving
    return fig, fig.subplots(rows, columns, squeeze=False, sharey=True)


def legend(fig: Figure, axes, width: str) -> None:
    """One legend for all panels (every series any of `axes` draws, once, in the order they first
    appear: one pair's panel may lack a method another's has), under them, in as many columns as
    fit the figure's width (measured, not guessed: tree labels such as `MTCP* (candidates)` are
    long); then lay out (after the title is set, so the layout leaves room for it)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(name, handle)
    handles, names = list(seen.values()), list(seen)
    renderer = fig.canvas.get_renderer()
    for columns in range(min(len(names), 9), 0, -1):
        made = fig.legend(handles, names, loc="lower center", ncol=columns, fontsize=6, frameon=False)
        if made.get_window_extent(renderer).width <= fig.bbox.width * 0.98 or columns == 1:
            break
        made.remove()
    legend_inches = made.get_window_extent(renderer).height / fig.dpi + 0.05
    fig.tight_layout(rect=(0, legend_inches / fig.get_figheight(), 1, 1))


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
