"""The batch sweep's table on hand-made rows: every batch's time counted once, speedup over AR
at the same batch, the first batch at which SD stops paying, and the batch-aware Eq. 1."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.decoding.calibration import Calibration
from pipeline.reports.batch_sweep import batch_table, batch_text
from pipeline.storage.calibration_store import Calibrations


def row(mode: str, sample: int, batch: int | None, seconds: float, *, accepted=(1, 1), requests=None) -> dict:
    sd = mode == "live"
    return {"target": "t", "draft": "d", "dtype": "fp32", "engine": "static", "gamma": 3 if sd else None,
            "method_label": "M" if sd else "AR", "methods": "M" if sd else "AR", "policy": "static",
            "verify": "chain" if sd else None, "verify_kind": "chain" if sd else None, "mode": mode, "turn": "first",
            "sample_id": f"s{sample}", "max_new_tokens": 4, "temperature": 0.0, "error": None, "batch": batch,
            "batch_requests": requests, "time_total_s": seconds, "time_request_s": seconds / 2,
            "output_ids": [7, 8, 9, 10], "accepted_per_block": list(accepted), "blocks": len(accepted)}


def sweep() -> pd.DataFrame:
    alone = [row(mode, s, None, t) for s in (0, 1) for mode, t in (("ar", 4.0), ("live", 2.0))]
    # batch 2: both requests in one batch; each row carries the batch's 5 s (AR) and 6 s (SD)
    paired = [row(mode, s, 2, t, requests=2) for s in (0, 1) for mode, t in (("ar", 5.0), ("live", 6.0))]
    return pd.DataFrame(alone + paired)


def test_speedup_counts_every_batch_once_and_names_where_it_stops_paying():
    table = batch_table(sweep(), Calibrations([])).reset_index()
    assert table["batch"].tolist() == [1, 2]
    assert table["speedup"].tolist() == pytest.approx([8.0 / 4.0, 5.0 / 6.0])
    assert table["tokens/s"].tolist() == pytest.approx([8 / 4.0, 8 / 6.0])  # 8 tokens, batch 2's 6 s once
    assert table["AR tokens/s"].tolist() == pytest.approx([8 / 8.0, 8 / 5.0])
    assert table["stops paying at batch"].tolist() == ["2", "2"] and table["expected"].isna().all()
    assert table["= AR here"].tolist() == ["2/2", "2/2"] and table["= batch 1"].tolist() == ["-", "2/2"]
    assert "1 of 1 SD configurations stop paying" in batch_text(batch_table(sweep(), Calibrations([])))


def test_expected_speedup_uses_the_costs_calibrated_at_each_batch():
    calibration = Calibration("t", "d", "cpu", "fp32", 3, 0.01, 0.02, 0.001, [0.001], 3, verify_tokens=[4],
                              verify_ratios=[1.5], draft_row_counts=[1], draft_rows_ratio=[0.1], batch_sizes=[2],
                              batch_verify_ratios=[[2.0]], batch_draft_ratios=[[0.2]])
    expected = batch_table(sweep(), Calibrations([calibration]))["expected"].tolist()
    tau = 2.0  # one accepted proposal per block
    assert expected == pytest.approx([tau / (3 * 0.1 + 1.5), tau / (3 * 0.2 + 2.0)])


def test_a_run_without_batches_has_no_batch_table():
    assert batch_table(sweep()[lambda r: r["batch"].isna()], Calibrations([])).empty
