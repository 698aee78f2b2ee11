"""What a reader of the report relies on: no table pools two dtypes of one pair, marks say what
they mean and never crown a slowdown, a bandit's depth never reads as a second gamma, the
summary opens with a short headline, and no two series of one axis look alike."""
from __future__ import annotations

import pandas as pd
import pytest
from matplotlib.lines import Line2D

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.verify_kinds import BanditTree
from pipeline.planning.grid import RunConfig
from pipeline.reports.acceptance import acceptance_table
from pipeline.reports.acceptance_plots import per_position_figure
from pipeline.reports.acceptance import per_position_table
from pipeline.reports.batch_plots import batch_figure
from pipeline.reports.headline import MAX_LINES
from pipeline.reports.marks import Marks, best_marks
from pipeline.reports.plots import series_styles
from pipeline.reports.weights_figure import weight_ratio_figure
from pipeline.reports.report import (
    category_table, gamma_shown, grid_gammas, markdown_table, method_findings, tau_table,
)
from pipeline.reports.speedup import SPEEDUP_MARKS, speedup_table
from pipeline.reports.summary import write_summary
from pipeline.storage.calibration_store import read_calibrations
from pipeline.storage.schema import make_row
from pipeline.storage.store import read_results
from tests.results_fixture import RUN, SMALL, write_results


@pytest.fixture(scope="module")
def fixture_out(tmp_path_factory):
    return write_results(tmp_path_factory.mktemp("reading"))


@pytest.fixture(scope="module")
def rows(fixture_out):
    return read_results(fixture_out, RUN)


def test_no_table_pools_the_fp32_and_bf16_rows_of_one_pair(rows, fixture_out):
    """A bf16 copy of the rows that accepts nothing (tau 1) must leave every fp32 figure as it was."""
    bf16 = rows.assign(dtype="bf16", accepted_per_block=rows["accepted_per_block"].map(lambda a: [0] * len(a)))
    both = pd.concat([rows, bf16], ignore_index=True)
    calibrations = read_calibrations(fixture_out)
    for name, build in {"tau": tau_table, "categories": category_table, "findings": method_findings,
                        "speedup": lambda r: speedup_table(r, calibrations)}.items():
        alone, mixed = build(rows), build(both)
        assert "dtype" in mixed.index.names, name
        fp32 = mixed.xs("fp32", level="dtype", drop_level=False)
        pd.testing.assert_frame_equal(fp32, alone, check_dtype=False, obj=name)
        assert len(mixed) == 2 * len(alone), name
    acceptance = acceptance_table(both)
    assert len(acceptance) == 2 * len(acceptance_table(rows))


def test_marks_never_crown_a_slowdown_and_the_caption_says_what_they_mean():
    table = pd.DataFrame({"method_label": ["AR", "M", "MT*", "MT* (bandit)"], "measured": [1.0, 0.43, 0.9, 0.26],
                          "tau": [1.0, 2.5, 3.1, 3.4], "J/token": [2.0, 1.5, 1.2, 1.9]}).set_index("method_label")
    marks = best_marks(table, SPEEDUP_MARKS)
    assert not any(column == "measured" for _, column in marks)  # every speedup is below 1
    assert marks[(3, "tau")] == "best" and marks[(2, "J/token")] == "best"  # lower is better there
    text = markdown_table(table, SPEEDUP_MARKS)
    assert "**0.43**" not in text and "**3.40**" in text and "**1.20**" in text
    assert "Bold: the best value of its column" in text and "measured: only a speedup above 1" in text
    assert "J/token: lower is better" in text
    faster = table.assign(measured=[1.0, 1.2, 1.4, 0.8])
    assert best_marks(faster, Marks(speedups=("measured",))) == {(2, "measured"): "best", (1, "measured"): "second"}
    assert markdown_table(table).count("**") == 0  # a table without marks says nothing about them


def test_a_bandit_prints_its_depth_and_the_grid_keeps_one_gamma(rows):
    bandit = RunConfig(SMALL, DecodeConfig("MT", verify=BanditTree()))
    from pipeline.data.sample import Sample
    from pipeline.decoding.records import SampleRecord

    sample = Sample("embedded_vqa", "test", 0, "first", "USER: hi ASSISTANT:", category="benchmark")
    made = make_row(RUN, "b", bandit, sample, SampleRecord(sample.sample_id, accepted_per_block=[2, 3],
                                                           output_ids=list(range(7))))
    both = pd.concat([rows, pd.DataFrame([made])], ignore_index=True)
    shown = gamma_shown(both)
    assert shown.iloc[-1] == "depth 4-6" and grid_gammas(both) == "5"
    assert set(shown[both["method_label"] == "AR"]) == {"-"}


def test_the_summary_opens_with_a_headline_of_at_most_fifteen_lines(rows, fixture_out):
    text = write_summary(fixture_out, RUN, rows)
    headline = text.split("\n## ")[1]
    lines = headline.strip().splitlines()
    assert lines[0] == "Headline" and len(lines) - 2 <= MAX_LINES
    assert "embedded:small_draft drafting for embedded:target (fp32): best chain" in headline
    assert "best tree" in headline and "measured" in headline and "expected" in headline
    assert "Lossless:" in headline and "Next:" in headline
    assert text.index("## Headline") < text.index("## Completeness")


def test_series_styles_are_distinct_for_twenty_labels():
    labels = ["M", "T", "C", "P", "MT", "MTC", "MTP", "MTCP", "MT*", "MTC*", "MTP*", "MTCP*", "TC", "TP", "CP",
              "MT* (candidates)", "MT* (bandit)", "MT* (dynamic(n=16,k=4))", "MT* (dynamic(n=8,k=2))",
              "MTCP* (candidates)", "M (bandit)"]
    styles = series_styles(labels)
    assert len(set(styles.values())) == len(labels)
    assert styles["MT* (candidates)"][0] == styles["MT*"][0] != styles["MTCP*"][0]


def _look_alikes(figure) -> list:
    """Labelled lines of one axis that share colour, marker, line style and fill."""
    found = []
    for ax in figure.axes:
        seen = {}
        for line in ax.get_lines():
            if isinstance(line, Line2D) and not line.get_label().startswith("_"):
                look = (line.get_color(), line.get_marker(), line.get_linestyle(), str(line.get_markerfacecolor()))
                if look in seen and seen[look] != line.get_label():
                    found.append((seen[look], line.get_label()))
                seen[look] = line.get_label()
    return found


def test_no_two_series_of_one_axis_share_colour_and_marker(rows):
    many = pd.concat([rows] + [rows[rows["method_label"] == "MT*"].assign(method_label=label)
                               for label in ("MTC*", "MTP*", "TC", "TP", "CP", "MTC", "MTP")], ignore_index=True)
    figures = [per_position_figure(per_position_table(many)), weight_ratio_figure(many)]
    sweep = pd.DataFrame([{"target": "t", "draft": "d", "dtype": "fp32", "temperature": 0.0, "batch": b,
                           "method_label": label, "policy": "static", "speedup": 1.0 + b / 10, "expected": 1.1}
                          for label in ("M", "MT*", "MT* (candidates)", "MT* (bandit)", "MT* (dynamic(n=16,k=4))")
                          for b in (1, 2, 4)])
    figures.append(batch_figure(sweep))
    for made in figures:
        assert made is not None and not _look_alikes(made[0]), made[1][:60]


def test_a_report_read_one_partition_folder_at_a_time_is_the_report_read_whole(tmp_path, monkeypatch):
    """The report as the jobs write it (`read_inputs`: a partition folder at a time, blocks
    counted a few rows at a time) is, file for file, the report of every row read at once, on a
    run with bandit trees, batched rows and a failed sample besides the fixture's."""
    import random

    from pipeline.data.sample import Sample
    from pipeline.decoding.records import SampleRecord
    from pipeline.reports import requests
    from pipeline.reports.report_inputs import read_inputs
    from pipeline.storage.store import report_dir, rows_to_table, write_shards
    from tests.results_fixture import DATASETS, ENVIRONMENT, SAMPLES

    out = write_results(tmp_path)
    rng, extra = random.Random(1), []
    bandit = RunConfig(SMALL, DecodeConfig("MT", verify=BanditTree()))
    arms = len(bandit.decode.verify.columns()["verify_shapes"])
    for dataset, category in DATASETS.items():
        for row in range(SAMPLES):
            sample = Sample(dataset, "test", row, "first", f"USER: <image>\nq{row} ASSISTANT:", category=category)
            accepted = [rng.randint(0, 4) for _ in range(5)]
            made = SampleRecord(sample.sample_id, mode="replay", engine="static", accepted_per_block=accepted,
                                shape_per_block=[rng.randrange(arms) for _ in accepted],
                                output_ids=list(range(sum(accepted) + 5)))
            extra.append(make_row(RUN, f"bandit-{dataset}", bandit, sample, made, False, ENVIRONMENT))
            for config in (RunConfig(SMALL, DecodeConfig("AR", gamma=None), batch=2),
                           RunConfig(SMALL, DecodeConfig("M"), batch=2)):
                made = SampleRecord(sample.sample_id, mode="ar" if config.decode.is_ar else "live", engine="static",
                                    accepted_per_block=[] if config.decode.is_ar else [1, 2, 0],
                                    output_ids=list(range(6)), time_total_s=1.5, time_wall_s=1.6,
                                    batch_requests=2)
                extra.append(make_row(RUN, f"batch-{dataset}", config, sample, made, False, ENVIRONMENT))
    failed = SampleRecord("embedded_vqa/test/9/first", error="image: cannot identify image file",
                          error_category="input")
    extra.append(make_row(RUN, "failed", bandit, Sample("embedded_vqa", "test", 9, "first", "USER: hi ASSISTANT:",
                                                         category="benchmark"), failed, False, ENVIRONMENT))
    for shard in dict.fromkeys(row["shard"] for row in extra):
        write_shards(out, rows_to_table([row for row in extra if row["shard"] == shard]))

    def report(rows) -> tuple[str, dict[str, bytes]]:
        text = write_summary(out, RUN, rows)
        return text, {p.name: p.read_bytes() for p in report_dir(out, RUN).iterdir()
                      if p.suffix in (".md", ".csv", ".tex", ".png")}

    whole = report(read_results(out, RUN))
    monkeypatch.setattr(requests, "ROWS_AT_ONCE", 7)  # slices that end mid-folder
    inputs = read_inputs(out, RUN)
    assert inputs.failed == 1 and len(inputs.cells[["draft", "dataset"]].drop_duplicates()) == 6
    streamed = report(inputs)
    assert "batch.csv" in whole[1] and "MT (bandit)" in whole[0] and "1 failed" in whole[0]
    assert streamed[0] == whole[0]
    assert streamed[1] == whole[1]
