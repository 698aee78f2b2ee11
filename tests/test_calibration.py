"""Calibration: the speedup formulas by hand, and a measurement that round-trips to disk."""
from __future__ import annotations

import pytest

from pipeline.results.calibration import MAX_ROWS, calibrate, expected_speedup, read_calibrations, write_calibration
from pipeline.decoding.engine import default_engine


def test_expected_speedup_equation_1_and_corrected_form():
    # paper Eq. 1 with the 7B/68M ratio 0.063 and tau 2.31 at gamma 5
    assert expected_speedup(2.31, 5, 0.063) == pytest.approx(2.31 / 1.315)
    # a verify forward costing 1.6 single steps (CPU) lowers the expectation
    assert expected_speedup(2.31, 5, 0.063, 1.6) == pytest.approx(2.31 / 1.915)


def test_calibration_measures_and_round_trips(tiny_pair, tmp_path):
    target, draft = tiny_pair
    result = calibrate(target, draft, gamma=3, repeats=3)
    assert result.target_token_s > 0 and result.target_verify_s > 0
    assert len(result.draft_rows_token_s) == MAX_ROWS and min(result.draft_rows_token_s) > 0
    assert result.ratio_draft_target == pytest.approx(result.draft_token_s / result.target_token_s)
    write_calibration(tmp_path, result)
    write_calibration(tmp_path, result)  # a re-run replaces, never duplicates
    table = read_calibrations(tmp_path)
    assert len(table) == 1
    assert table.loc[0, "ratio_verify"] == pytest.approx(result.ratio_verify)
    assert read_calibrations(tmp_path / "empty").empty


@pytest.mark.parametrize("engine", ["static", "eager"])
def test_calibration_times_the_engine_it_names(tiny_pair, engine):
    target, draft = tiny_pair
    result = calibrate(target, draft, gamma=3, repeats=2, engine=engine)
    assert result.engine == engine and result.target_token_s > 0
    assert calibrate(target, draft, gamma=3, repeats=2).engine == default_engine(target, draft)
