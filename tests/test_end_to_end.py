"""The main job end to end on the smoke grid (tiny models, local Ray), then the notebook on
its results, headless."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_smoke(out: Path, *extra: str, grid: str = "configs/smoke.yaml") -> str:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "jobs/full_grid.py", "--grid", grid, "--out", str(out), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    return out, run_smoke(out)


@pytest.mark.slow
def test_full_grid_job_writes_results_tables_and_plots(smoke_results):
    out, stdout = smoke_results
    assert "## Headline" in stdout and "best chain" in stdout and "Lossless:" in stdout
    assert "time: start-up" in stdout and "calibration" in stdout.split("time: ")[-1]
    assert "compacted run smoke:" in stdout and "compaction" in stdout.split("time: ")[-1]
    folders = {path.parent for path in (out / "run=smoke").rglob("part-*.parquet")}
    files = [path.name for folder in folders for path in folder.glob("part-*.parquet")]
    assert len(files) == len(folders) > 1 and all(name.startswith("part-compacted-") for name in files)
    report = out / "_report-smoke"
    for name in ("summary.md", "tau.csv", "categories.csv", "speedup.csv", "lossless.csv", "tau.png", "weights.png"):
        assert (report / name).stat().st_size > 0, name
    summary = (report / "summary.md").read_text()
    assert "## Lossless audit" in summary and "Every audited row" in summary  # fp32: exact
    assert "## Images" in summary and "Complete: all 336 expected rows are present" in summary
    assert "## Replay fidelity" in summary and "## Calibration used" in summary
    assert "Measured walltimes come from these first-turn samples" in summary
    assert list((out / "_calibration").glob("*.parquet"))
    import pandas as pd

    speedup = pd.read_csv(report / "speedup.csv")
    sd = speedup[speedup["method_label"] != "AR"]
    assert sd["eq1"].notna().all() and sd["measured"].notna().all()  # calibrated and timed live
    fidelity = pd.read_csv(report / "fidelity.csv")
    assert fidelity["checked"].sum() == fidelity["live rows"].sum() > 0  # every live greedy SD row checked
    calibration = pd.read_csv(report / "calibration.csv")
    assert calibration["rounds x repeats"].tolist() == ["5 x 10"] * 3 and calibration["Tq/Tp"].str.contains(r"\[").all()
    assert set(calibration["draft"]) == {"tiny:draft", "tiny:mamba_draft", "tiny:mamba2_draft"}


@pytest.mark.slow
def test_a_rerun_that_adds_no_rows_reuses_the_calibration_unless_asked(smoke_results):
    out, _ = smoke_results
    calibration = next((out / "_calibration").glob("*.parquet"))
    measured = calibration.read_bytes()
    stdout = run_smoke(out)
    assert "0 rows written" in stdout and "reusing the one measured" in stdout
    assert calibration.read_bytes() == measured  # the speedup table is what it was
    stdout = run_smoke(out, "--recalibrate")
    assert "reusing" not in stdout and "over 5 rounds" in stdout and calibration.read_bytes() != measured


@pytest.mark.slow
def test_a_scaled_copy_of_the_run_reports_alike_read_whole_or_by_the_columns_it_needs(smoke_results, tmp_path):
    """bench/scale.py's copy of a real run (3x its rows) is keyed once and complete by its manifest;
    its report from the columns the report reads (the weights only of the rows drawn) is, table
    for table and figure for figure, the report from every column of every row (the old way)."""
    from pipeline.reports.report_rows import read_report_rows
    from pipeline.reports.summary import write_summary
    from pipeline.storage.store import read_results, report_dir

    out, _ = smoke_results
    made = subprocess.run([sys.executable, "bench/scale.py", "--rows", "1000", "--template", str(out), "--steps", "",
                           "--work", str(tmp_path), "--log-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert made.returncode == 0 and "rows=1008" in made.stdout, made.stderr[-2000:]
    copy = tmp_path / "rows-1000"
    everything = read_results(copy, "smoke")
    assert len(everything) == 3 * 336 and everything["key"].is_unique

    def report(rows) -> tuple[str, dict[str, bytes]]:
        text = write_summary(copy, "smoke", rows)
        files = report_dir(copy, "smoke").iterdir()
        return text, {p.name: p.read_bytes() for p in files if p.suffix in (".md", ".csv", ".tex", ".png")}

    old, new = report(everything), report(read_report_rows(copy, "smoke"))
    assert "Complete: all 1008 expected rows are present" in new[0] and "weights.png" in new[1]
    assert new[0] == old[0] and new[1] == old[1]


@pytest.mark.slow
def test_notebook_runs_headless_on_smoke_results(smoke_results, tmp_path):
    from tests.test_notebook import executed_notebook

    text, outputs = executed_notebook(smoke_results[0], tmp_path)
    assert "matches pipeline.reports.report.tau_table" in text and "run smoke, target tiny:bigram_target (fp32), drafts ['tiny:mamba2_draft', 'tiny:mamba_draft']" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2  # both figures shown inline


@pytest.mark.slow
def test_a_pair_that_fails_to_load_in_the_actor_ends_the_job_in_one_line(tmp_path):
    """Only the actor can find out that weights are corrupt: the job says so once, without
    the hundreds of traceback lines Ray would relay for every retried call."""
    import shutil

    import yaml

    from actors.model_files import ensure_tiny_models

    broken = tmp_path / "broken_target"
    shutil.copytree(ensure_tiny_models() / "target", broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not weights")
    grid = tmp_path / "broken.yaml"
    grid.write_text(yaml.safe_dump({"name": "broken", "datasets": ["embedded_vqa"], "methods": ["AR", "M"], "limit": 2,
                                    "pairs": [{"target": str(broken), "draft": "tiny:draft"}]}))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "jobs/full_grid.py", "--grid", str(grid), "--out", str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    ours = [line for line in (done.stdout + done.stderr).splitlines() if "ray" not in line.lower() or "run broken" in line]
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "could not start: safetensors" in done.stderr and "SafetensorError" in done.stderr
    assert len(ours) <= 4, ours
