"""Noise is never printed as a finding: a latency ratio whose rounds spread too far, or a walltime
taken on an overloaded machine, makes the figures that rest on it `unreliable` in the speedup and
draft-size tables, with the spread, and the summary says so in its measurement-noise section."""
from __future__ import annotations

import pandas as pd

from pipeline.storage.calibration_store import calibration_path, read_calibrations, write_calibration
from pipeline.reports.noise import SPREAD_LIMIT, Spread
from pipeline.storage.store import read_results
from pipeline.reports.summary import write_summary
from tests.results_fixture import LARGE, LOADED, RUN, SMALL, calibration, write_results


def section(summary: str, title: str) -> str:
    return summary.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def speedup_rows(out):
    table = pd.read_csv(out / f"_report-{RUN}" / "speedup.csv")
    return table[table["method_label"] != "AR"]


def test_a_quiet_run_prints_its_figures_and_says_how_quiet_it_was(tmp_path):
    out = write_results(tmp_path)
    summary = write_summary(out, RUN, read_results(out, RUN))
    speedup = speedup_rows(out)
    assert speedup["noise"].isna().all() and speedup["eq1"].notna().all()
    noise = section(summary, "Measurement noise")
    assert "No figure is flagged" in noise and "10% of its median" in noise and "peaked at 0.5 on 2 cores" in noise
    cells = [cell.strip() for line in section(summary, "Speedup").splitlines() if line.startswith("| ") for cell in line.split("|")]
    assert "unreliable" not in cells


def test_a_calibration_whose_rounds_disagree_makes_its_expected_speedups_unreliable(tmp_path):
    out = write_results(tmp_path)
    noisy = calibration(SMALL, 0.04, LOADED, measured_at="2026-11-25T01:00:00+00:00", load=8.3)
    write_calibration(out, noisy)
    summary = write_summary(out, RUN, read_results(out, RUN))
    speedup = speedup_rows(out)
    small, large = speedup[speedup["draft"] == SMALL.draft], speedup[speedup["draft"] == LARGE.draft]
    assert small["noise"].str.contains("eq1: Tq/Tp rounds 0.007 0.020", regex=False).all()
    assert small["noise"].str.contains("corrected: Tq", regex=False).all()
    assert large["noise"].isna().all()  # the other draft's calibration is quiet
    shown = section(summary, "Speedup")
    small_lines = [line for line in shown.splitlines() if f"| {SMALL.draft} |" in line and "| AR |" not in line]
    assert small_lines and all(line.count("unreliable") >= 2 for line in small_lines)
    noise = section(summary, "Measurement noise")
    assert f"**Calibration of {SMALL.target} <- {SMALL.draft} (fp32)**" in noise
    assert "Tq/Tp rounds 0.007 0.020 0.040 0.160 0.508 (middle rounds spread 350% of the median)" in noise
    assert "load 8.3 on 2 cores while it measured" in noise and "hold unreliable figures" in noise
    sizes = section(summary, "Draft sizes")
    assert "unreliable" in [cell.strip() for line in sizes.splitlines() if f"| {SMALL.draft} |" in line
                            for cell in line.split("|")]


def test_walltimes_timed_above_the_machines_cores_are_unreliable(tmp_path):
    out = write_results(tmp_path, timed_load=5.2)
    summary = write_summary(out, RUN, read_results(out, RUN))
    timed = speedup_rows(out).dropna(subset=["measured"])
    assert len(timed) and timed["noise"].str.contains("measured: load 5.2 on 2 cores", regex=False).all()
    noise = section(summary, "Measurement noise")
    assert f"**Timed decodes of {SMALL.target} <- {SMALL.draft} (fp32)**: load 5.2 on 2 cores" in noise


def test_the_speedup_table_says_which_samples_its_tau_pools():
    """tau pools every first-turn block of every dataset; `tau timed` the timed samples only."""
    import tempfile
    from pathlib import Path

    out = write_results(Path(tempfile.mkdtemp()))
    summary = write_summary(out, RUN, read_results(out, RUN))
    title = section(summary, "Speedup").splitlines()[0]
    assert "OOD included" in title and "`tau timed`" in title and "Avg." in title
    timed = speedup_rows(out).dropna(subset=["measured"])
    assert (timed["tau timed"] != timed["tau"]).any()


def test_the_verify_cost_curve_carries_the_range_of_its_rounds(tmp_path):
    write_calibration(tmp_path, calibration(SMALL, 0.04))
    curve = read_calibrations(tmp_path).verify_curves().set_index("tokens")
    assert curve.loc[16, "low"] == 1.9 * 0.9 and curve.loc[16, "high"] == 1.9 * 1.1 and curve.loc[1, "low"] == 1.0
    assert calibration_path(tmp_path, SMALL.target, SMALL.draft, "fp32").is_file()


def test_the_spread_limit_separates_quiet_rounds_from_loaded_ones():
    """Rounds measured by bench/calibration_noise.py (bench/results/calibration-noise-*): the
    widest quiet ratio, a quiet one with one stray round, and loaded ones."""
    widest_quiet = Spread("Tq(4 rows)/Tp", (0.0551, 0.0574, 0.0569, 0.0533, 0.0537))
    assert not widest_quiet.noisy and round(widest_quiet.relative, 3) == 0.058
    assert not Spread("Tq(6 rows)/Tp", (0.0606, 0.0921, 0.0612, 0.0585, 0.0574)).noisy  # one stray round
    assert Spread("Tq/Tp", (0.0098, 0.0260, 0.0342, 0.0063, 0.0012)).noisy  # loaded
    assert Spread("Tq/Tp", (0.007, 0.02, 0.04, 0.3, 0.509)).noisy  # the first-hour report's loaded machine
    assert Spread("Tq/Tp", (0.04,)).relative != Spread("Tq/Tp", (0.04,)).relative  # one round: nothing to judge
    assert 0 < SPREAD_LIMIT < 1
