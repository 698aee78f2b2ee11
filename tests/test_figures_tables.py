"""Figures never pool model pairs, the Fig. 3 ratio is drawn from the recorded weights, and the
LaTeX tables carry the paper's marks (ties included) in a well-formed tabular."""
from __future__ import annotations

import re

import numpy as np
import pytest
import pandas as pd

from pipeline.decoding.config import DecodeConfig
from pipeline.data.sample import Sample
from pipeline.decoding.records import SampleRecord
from pipeline.drafting.policies import GridSearchPolicy
from pipeline.planning.grid import Pair, RunConfig
from pipeline.reports.marks import HIGHER_EVERYWHERE
from pipeline.reports.latex import latex_table, paper_tables
from pipeline.reports.plots import FORMATS, save, tau_cells
from pipeline.reports.weights_figure import weight_ratio_figure
from pipeline.reports.tau_heatmap import tau_figure
from pipeline.reports.report import category_table, markdown_table, tau_table
from pipeline.storage.schema import make_row

STRONG, WEAK = Pair("big", "small"), Pair("big", "tiny")


def frame(*specs) -> pd.DataFrame:
    """Rows from (pair, methods, dataset, category, accepted per block, weights per block)."""
    out = []
    for n, (pair, methods, dataset, category, accepted, weights) in enumerate(specs):
        policy = GridSearchPolicy() if weights else None
        config = RunConfig(pair, DecodeConfig(methods, policy)) if policy else RunConfig(pair, DecodeConfig(methods))
        sample = Sample(dataset, "test", n, "first", "USER: hi ASSISTANT:", category=category)
        record = SampleRecord(sample.sample_id, accepted_per_block=accepted, weights_per_block=weights or [],
                              output_ids=[1] * (len(accepted) + sum(accepted)))
        out.append(make_row("r", "s", config, sample, record))
    return pd.DataFrame(out)


def test_tau_figure_never_pools_pairs():
    rows = frame((STRONG, "M", "pope", "benchmark", [4, 4], None), (WEAK, "M", "pope", "benchmark", [0, 0], None),
                 (STRONG, "T", "pope", "benchmark", [2, 2], None), (WEAK, "T", "vist", "ood", [1, 1], None))
    cells = tau_cells(rows)
    per_pair = cells.set_index(["draft", "dataset", "method_label"])["tau"]
    assert per_pair[("small", "pope", "M")] == 5.0 and per_pair[("tiny", "pope", "M")] == 1.0  # not 3.0
    assert cells.groupby(["draft", "turn", "dataset", "method_label"]).size().max() == 1
    figure, caption = tau_figure(rows)
    panels = [ax for ax in figure.axes if ax.images]  # the colour bar is an axis too
    assert len(panels) == 2  # one heatmap per pair (x one turn)
    names = [ax.get_ylabel() for ax in panels]  # a row of panels per pair, named on its first panel
    assert any("<- small (fp32)" in t for t in names) and any("<- tiny (fp32)" in t for t in names)
    assert "target big" in figure._suptitle.get_text()  # one target: named once, above the panels
    assert "2 pair(s)" in caption and "gamma 5" in caption
    for ax in panels:  # each cell holds its own pair's tau, printed in it
        rows_named = [t.get_text() for t in ax.get_yticklabels()]
        columns = [t.get_text() for t in ax.get_xticklabels()]
        values = ax.images[0].get_array()
        m_pope = values[rows_named.index("M"), columns.index("pope")]
        assert m_pope == (5.0 if "small" in ax.get_ylabel() else 1.0)
        assert f"{m_pope:.2f}" in [t.get_text() for t in ax.texts]


def test_weight_ratio_figure_is_the_share_of_m_per_block(tmp_path):
    weights = [[0.5, 0.5], [0.8, 0.2], [0.0, 1.0]]
    rows = frame((STRONG, "MT", "pope", "benchmark", [1, 3, 0], weights),
                 (STRONG, "MT", "vist", "ood", [2, 2], [[0.5, 0.5], [1.0, 0.0]]))
    figure, caption = weight_ratio_figure(rows)
    assert len([ax for ax in figure.axes if ax.get_visible()]) == 2  # one panel per category
    benchmark = next(ax for ax in figure.axes if ax.get_title().startswith("benchmark"))
    line = next(l for l in benchmark.get_lines() if l.get_label() == "MT*")
    assert np.allclose(line.get_ydata(), [0.5, 0.8, 0.0, 0.0])  # the last value repeats to the block's end
    assert {l.get_label() for l in benchmark.get_lines()} >= {"M only", "T only", "static MT"}
    assert "gamma 5" in caption and "big <- small (fp32)" in caption
    paths = save(figure, tmp_path / "weights")
    assert [p.suffix for p in paths] == [f".{f}" for f in FORMATS] and all(p.stat().st_size > 0 for p in paths)


def ranked(values: dict[str, float]) -> pd.DataFrame:
    index = pd.MultiIndex.from_tuples([("t", "d", "first", label) for label in values],
                                      names=["target", "draft", "turn", "method_label"])
    return pd.DataFrame({"pope": list(values.values())}, index=index)


def test_three_tied_for_best_leave_no_second():
    table = ranked({"AR": 1.0, "M": 3.0, "T": 3.0, "C": 3.0, "P": 2.5})
    marked = markdown_table(table, HIGHER_EVERYWHERE)
    assert "| M | **3.00** |" in marked and "| P | 2.50 |" in marked
    latex = latex_table(table, caption="c", label="l")
    assert latex.count("\\textbf{3.00}") == 3 and "\\underline" not in latex
    alone = ranked({"M": 3.0, "T": 2.0, "C": 2.0, "P": 1.5})
    assert latex_table(alone, caption="c", label="l").count("\\underline{2.00}") == 2  # tied seconds


def well_formed(latex: str, columns: int) -> None:
    body = latex.split("\\toprule")[1].split("\\bottomrule")[0]
    for line in body.strip().splitlines():
        if line.startswith("\\midrule") or line.startswith("\\multicolumn"):
            continue
        assert line.endswith("\\\\") and line.count(" & ") == columns, line
    assert latex.count("{") == latex.count("}") and latex.count("\\begin{") == latex.count("\\end{")


def test_paper_tables_in_latex_carry_marks_and_ood_daggers():
    rows = frame((STRONG, "M", "pope", "benchmark", [4, 4], None), (STRONG, "T", "pope", "benchmark", [2, 2], None),
                 (STRONG, "MT", "pope", "benchmark", [3, 3], None), (STRONG, "M", "vist", "ood", [1, 1], None),
                 (STRONG, "T", "vist", "ood", [3, 3], None), (STRONG, "MT", "vist", "ood", [0, 0], None))
    tau, categories = tau_table(rows), category_table(rows)
    tex = paper_tables(rows, tau, categories)
    table1 = tex["table1.tex"]
    well_formed(table1, len(tau.columns))
    assert "POPE & VIST$^{\\dagger}$ & Avg." in table1 and "out of distribution" in table1
    assert "M & \\textbf{5.00} & \\underline{2.00} & \\textbf{5.00}" in table1
    assert "T & 3.00 & \\textbf{4.00} & 3.00" in table1 and "MT & \\underline{4.00} & 1.00 & \\underline{4.00}" in table1
    assert "\\emph{big $\\leftarrow$ small, fp32, first turn}" in table1
    well_formed(tex["table2.tex"], len(categories.columns))
    assert re.search(r"Ood first\$\^\{\\dagger\}\$", tex["table2.tex"])


PAGE_HEIGHT_IN = 9.0  # a page's text height (US letter or A4 with 1-inch margins)


@pytest.mark.parametrize("width", ["two-column", "one-column"])
def test_figures_fit_their_width_with_the_legend_inside_and_one_column_fits_a_page(tmp_path, width):
    """Saved with a tight bounding box, a figure whose legend or labels stick out of its canvas
    grows past the nominal size: the file must stay within it. Rows of the default job's
    shape: two drafts, three turns, twelve method labels with the candidate trees."""
    from PIL import Image

    from pipeline.reports.plots import WIDTHS, verify_cost_figure
    from pipeline.storage.store import read_results
    from tests.results_fixture import RUN, write_results

    out = write_results(tmp_path / "results")
    rows = read_results(out, RUN)
    third_turn = rows[rows["turn"] == "qaorg"].assign(turn="gsm8k")
    rows = pd.concat([rows, third_turn], ignore_index=True)
    curves = pipeline_calibrations(out).verify_curves()
    figures = {"tau": tau_figure(rows, width=width), "weights": weight_ratio_figure(rows, width=width),
               "verify_cost": verify_cost_figure(curves, width=width)}
    for name, made in figures.items():
        figure = made[0]
        w, h = figure.get_size_inches()
        assert w == WIDTHS[width], name
        if width == "one-column":
            assert h <= PAGE_HEIGHT_IN, f"{name}: {h:.1f} in tall"
        titles = [ax.title.get_window_extent() for ax in figure.axes if ax.get_visible() and ax.get_title()]
        for i, a in enumerate(titles):
            assert not any(a.overlaps(b) for b in titles[i + 1:]), f"{name}: panel titles run into each other"
        path = tmp_path / f"{name}-{width}.png"
        figure.savefig(path, dpi=100, bbox_inches="tight", pad_inches=0)
        tight_w, tight_h = Image.open(path).size
        assert tight_w <= round(w * 100) + 1 and tight_h <= round(h * 100) + 1, (name, (tight_w, tight_h), (w * 100, h * 100))


def pipeline_calibrations(out):
    from pipeline.storage.calibration_store import read_calibrations

    return read_calibrations(out)
