"""Table-1 aggregation: tau pooled over blocks, errors left out, Avg. over benchmark datasets."""
from __future__ import annotations

import pandas as pd
import pytest

import jobs.summarize as summarize
from pipeline.data.sample import Sample
from pipeline.decoding.config import PolicySpec
from pipeline.decoding.records import SampleRecord
from pipeline.grid import Pair, RunConfig
from pipeline.report import AVERAGE, tau_table
from pipeline.results import make_row, read_results, rows_to_table, write_shard

PAIR = Pair("tiny:target", "tiny:draft")


def rows(config, dataset, category, accepted, error_row=None):
    out = []
    for i, blocks in enumerate(accepted):
        blocks = [0] * len(blocks) if config.is_ar else blocks  # AR: one token per block
        sample = Sample(dataset, "test", i, "first", "USER: hi ASSISTANT:", category=category)
        rec = SampleRecord(sample.sample_id, mode="ar" if config.is_ar else "live", accepted_per_block=blocks,
                           output_ids=[1] * (len(blocks) + sum(blocks)), error="boom" if i == error_row else None)
        out.append(make_row("r", f"{dataset}-{config.key()}", config, sample, rec))
    return out


@pytest.fixture
def results_dir(tmp_path):
    mt = RunConfig(PAIR, "MT")
    mt_star = {w: RunConfig(PAIR, "MT", PolicySpec("grid", window=w)) for w in (None, 4)}
    ar = RunConfig(PAIR, "AR", gamma=None)
    for config, accepted in [(mt, [[5, 1], [0]]), (mt_star[None], [[2, 2], [4]]), (mt_star[4], [[3], [3]]),
                             (ar, [[0, 0], [0]])]:
        write_shard(tmp_path, rows_to_table(rows(config, "pope", "benchmark", accepted + [[5]], error_row=2)))
        write_shard(tmp_path, rows_to_table(rows(config, "mmvet", "benchmark", [[1]])))
        write_shard(tmp_path, rows_to_table(rows(config, "vist", "ood", [[0, 1]])))
    return tmp_path


def test_tau_is_pooled_over_blocks_without_error_rows(results_dir):
    table = tau_table(read_results(results_dir))
    assert list(table.columns) == ["mmvet", "pope", "vist", AVERAGE]
    labels = [(idx[3], idx[4]) for idx in table.index]  # window varies within MT*: it becomes a level
    assert labels == [("AR", "-"), ("MT", "-"), ("MT*", "-"), ("MT*", 4)]
    cell = table.xs("MT", level="method_label")
    assert cell["pope"].item() == pytest.approx(1 + 6 / 3)  # blocks [5, 1] and [0]; the error row is left out
    assert cell["vist"].item() == pytest.approx(1.5)
    assert cell[AVERAGE].item() == pytest.approx((3.0 + 2.0) / 2)  # benchmark datasets only
    assert table.xs("AR", level="method_label")[AVERAGE].item() == 1.0
    star_all = table.xs(("MT*", "-"), level=("method_label", "window"))
    assert star_all["pope"].item() == pytest.approx(1 + 8 / 3)


def test_summarize_prints_the_table(results_dir, capsys, tmp_path):
    csv = tmp_path / "table.csv"
    assert summarize.main([str(results_dir), "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "run r: block efficiency tau" in out and "MT*" in out and "failed samples" in out
    assert len(pd.read_csv(csv)) == 4
    assert summarize.main([str(tmp_path / "empty")]) == 1
