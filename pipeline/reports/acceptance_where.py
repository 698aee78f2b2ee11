"""Acceptance where it changes: tau and the acceptance rate per prompt-length bucket and per
number of images in the prompt, per configuration (turns pooled: second turns are where
prompts grow), and a figure of each. A prompt's length is the target's tokens as tokenized
(`prompt_tokens`; an image counts as its placeholder tokens); bucket edges are parameters.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pipeline.reports.acceptance import CONFIG, speculative_rows
from pipeline.reports.plots import (
    legend, pair_label, panel_label, panels, save, series_styles, suptitle_target,
)
from pipeline.reports.report import markdown_table, method_order
from pipeline.reports.requests import Requests, requests_from

CONTEXT_EDGES = (128, 256, 512, 1024, 2048)  # prompt tokens: buckets below, between and above these
INDEX = [c for c in CONFIG if c != "turn"]


def context_buckets(tokens: pd.Series, edges: Sequence[int] = CONTEXT_EDGES) -> pd.Series:
    """Each prompt length's bucket label: `<128`, `128-255`, ..., `>=2048`."""
    bounds = [0, *edges]
    labels = [f"<{edges[0]}", *(f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])), f">={edges[-1]}"]
    cut = pd.cut(tokens, bins=[*bounds, np.inf], right=False, labels=labels)
    return cut.astype(object).where(tokens.notna(), None)


def acceptance_by(source: pd.DataFrame | Requests, column: str, bucket: Callable[[pd.Series], pd.Series]
                  ) -> pd.DataFrame:
    """Per configuration and value of `bucket(rows' column)` (named `column`): requests,
    pooled tau and the acceptance rate (accepted drafts over drafted positions)."""
    sd = speculative_rows(source)
    if column not in sd:  # rows from before the column was recorded
        return pd.DataFrame()
    read = {c: sd[c] for c in [*INDEX, "accepted", "blocks", "drafted"]}  # the columns it sums, uncopied
    sd = pd.DataFrame({**read, column: bucket(sd[column])}, copy=False)
    sd = sd[sd[column].notna()]
    if sd.empty:
        return pd.DataFrame()
    summed = sd.groupby([*INDEX, column], observed=True, sort=False)[["accepted", "blocks", "drafted"]].sum()
    table = pd.DataFrame({"requests": sd.groupby([*INDEX, column], observed=True, sort=False).size(),
                          "tau": 1 + summed["accepted"] / summed["blocks"],
                          "acceptance_rate": summed["accepted"] / summed["drafted"]}).reset_index()
    key = table.apply(lambda r: (r["target"], r["draft"], r["dtype"], method_order(r["method_label"])),
                      axis=1)
    return table.loc[key.sort_values(kind="stable").index].reset_index(drop=True)


def acceptance_by_context(source: pd.DataFrame | Requests, edges: Sequence[int] = CONTEXT_EDGES
                          ) -> pd.DataFrame:
    bucket = lambda tokens: context_buckets(tokens.astype(float), edges)
    table = acceptance_by(source, "prompt_tokens", bucket)
    if table.empty:
        return table
    order = list(context_buckets(pd.Series([0, *edges], dtype=float), edges))
    return table.rename(columns={"prompt_tokens": "prompt_tokens_bucket"}).assign(
        bucket_order=lambda t: t["prompt_tokens_bucket"].map(order.index)).sort_values(
        [*INDEX[:3], "bucket_order"], kind="stable").drop(columns="bucket_order").reset_index(drop=True)


def acceptance_by_images(source: pd.DataFrame | Requests) -> pd.DataFrame:
    table = acceptance_by(source, "images", lambda images: images)
    return table if table.empty else table.sort_values([*INDEX[:3], "images"], kind="stable")


def acceptance_where_figure(table: pd.DataFrame, column: str, xlabel: str,
                            width: str = "two-column") -> tuple[Figure, str] | None:
    """tau against `column`'s values, a panel per pair, a line per configuration verified as a
    chain (trees are in the CSV)."""
    table = table[~table["method_label"].str.contains(" (", regex=False)] if len(table) else table
    if table.empty:
        return None
    pairs = list(dict.fromkeys(zip(table["target"], table["draft"], table["dtype"])))
    fig, axes = panels(1, len(pairs), width, panel_height=2.0)
    labels = sorted(set(table["method_label"]), key=method_order)
    styles = series_styles(labels)
    values = list(dict.fromkeys(table[column].astype(str)))
    for pair, ax in zip(pairs, axes.flat):
        mine = table[(table["target"] == pair[0]) & (table["draft"] == pair[1]) & (table["dtype"] == pair[2])]
        for label in labels:
            line = mine[mine["method_label"] == label]
            if len(line):
                ax.plot([values.index(v) for v in line[column].astype(str)], line["tau"], lw=1, ms=2.5,
                        marker=styles[label][1], color=styles[label][0], label=label)
        ax.set_xticks(range(len(values)), values, fontsize=6, rotation=30)
        ax.tick_params(labelsize=6)
        ax.set_xlabel(xlabel, fontsize=6)
        ax.set_title(panel_label(pair, pairs), fontsize=6)
    axes.flat[0].set_ylabel("tau", fontsize=7)
    fig.suptitle(f"tau by {xlabel}{suptitle_target(pairs)}", fontsize=8)
    legend(fig, axes.flat, width)
    caption = (f"Block efficiency tau (accepted proposals + 1 per block, pooled over blocks and turns) by "
               f"{xlabel}, a line per configuration verified as a chain (trees and the acceptance rate are "
               f"in the CSV); few requests per point make a point noisy (`requests` in the CSV). "
               f"Pairs: {'; '.join(pair_label(*p) for p in pairs)}.")
    return fig, caption


def acceptance_where_section(source: pd.DataFrame | Requests, folder: Path,
                             edges: Sequence[int] = CONTEXT_EDGES) -> str:
    """`acceptance_by_context.csv` and `acceptance_by_images.csv`, a figure of each, and their
    section of the summary ("" for rows from before prompt lengths were recorded)."""
    lines, requests = [], requests_from(source)
    for stem, table, column, xlabel in (
        ("acceptance_by_context", acceptance_by_context(requests, edges), "prompt_tokens_bucket",
         "prompt tokens"),
        ("acceptance_by_images", acceptance_by_images(requests), "images", "images in the prompt"),
    ):
        if table.empty:
            continue
        table.to_csv(folder / f"{stem}.csv", index=False)
        lines.append(f"### By {xlabel} (`{stem}.csv`)\n\n"
                     + markdown_table(table.set_index([*INDEX, column]).round(3)))
        made = acceptance_where_figure(table, column, xlabel)
        if made is not None:
            save(made[0], folder / stem)
            lines.append(f"![{stem}]({stem}.png)\n\n> {made[1]}")
    if not lines:
        return ""
    return ("## Acceptance where it changes: by prompt length and by images (per configuration, turns "
            "pooled)\n\n" + "\n\n".join(lines))
