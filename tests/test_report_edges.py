"""Reports of runs at the edge: every row failed, every speculative row failed, and names that
would break a Markdown table."""
from __future__ import annotations

from pathlib import Path

import pytest

import jobs.summarize as summarize
from pipeline.decoding.config import DecodeConfig
from pipeline.planning.grid import Pair
from pipeline.storage.schema import make_row
from pipeline.storage.store import rows_to_table, write_shard
from tests.test_results import record
from tests.test_run_safety import PAIR, RunConfig, sample


def write_run(out: Path, failing: set[str], pair: Pair = PAIR) -> None:
    """Three samples decoded by AR and by M, the methods in `failing` failed on every sample."""
    for method in ("AR", "M"):
        config = RunConfig(pair, DecodeConfig(method, gamma=None) if method == "AR" else DecodeConfig(method))
        rows = []
        for i in range(3):
            made = record(f"toy/test/{i}/first", error="CUDA out of memory" if method in failing else None)
            made.mode = made.mode if made.error or method != "AR" else "ar"
            rows.append(make_row("r", f"s{method}", config, sample(i), made))
        write_shard(out, rows_to_table(rows))


def test_a_run_whose_every_row_failed_reports_its_failures(tmp_path, capsys):
    write_run(tmp_path, {"AR", "M"})
    assert summarize.main([str(tmp_path)]) == 0  # was a TypeError on an empty frame
    text = (tmp_path / "_report-r" / "summary.md").read_text()
    assert "every one failed" in text and "| CUDA out of memory | 6 |" in text and "| toy | first | 6 |" in text


@pytest.mark.parametrize("failing", [{"M"}, {"AR"}])
def test_a_run_whose_speculative_or_ar_rows_all_failed_still_reports(tmp_path, failing):
    write_run(tmp_path, failing)
    assert summarize.main([str(tmp_path)]) == 0
    assert "3 failed" in (tmp_path / "_report-r" / "summary.md").read_text()


def test_model_names_cannot_break_a_table_or_inject_html(tmp_path):
    write_run(tmp_path, set(), Pair("/models/<b>big|target</b>", "tiny:draft"))
    assert summarize.main([str(tmp_path)]) == 0
    text = (tmp_path / "_report-r" / "summary.md").read_text()
    assert "<b>" not in text and "&lt;b>big\\|target&lt;/b>" in text
    header = next(line for line in text.splitlines() if line.startswith("| target | draft"))
    row = next(line for line in text.splitlines() if "big\\|target" in line)
    assert row.replace("\\|", "").count("|") == header.count("|")  # the row keeps its columns
