"""The main job end to end on the smoke grid: submitted with `ray job submit` to a local
`ray start --head` with authentication on, then rerun locally on its results, and the notebook
on them, headless.

The head runs as `ray start --block` in its own session on free ports, so the test never
touches another Ray on the machine and stops exactly the processes it started.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.planning.grid_file import load_grid
from pipeline.storage.schema import SCHEMA
from pipeline.storage.store import read_results

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


# The smoke run's rows (timings left out): a refactor must not change a single value. Written
# before the layout moved into core / planning / cluster wings; rewritten when row keys came to
# include the prompt hash, and when walltime samples came to be chosen by seed (the `timed` and
# `replay_accepted_per_block` columns, modes and shard ids changed), checked equal on every
# other column each time; the `answer` column (null here) was added by hand. The timed
# sample's AR row moved into its live shard (decoded once for every draft): shard ids only.
# The `steps`, `fallback` and `verify` columns were added from runs whose other columns all matched,
# and so were the structured verify columns (`verify_kind`, `verify_nodes`, `verify_top_k`, `verify_shapes`) and
# `shape_per_block`. The bigram target's rows with the Mamba and Mamba2 drafts were added when the smoke grid
# gained them, the first pair's rows equal to those before. The `batch` (1) and `batch_requests` (null)
# columns were added to rows whose other columns all matched, and so were `verify_knobs` and
# `verify_block_shapes` when one decoder came to serve every batch size. The EAGLE head's rows were
# added when the smoke grid gained it; the Mamba drafts' rows changed only their shard ids (the head
# joined their target's model group, which names the shards).
SMOKE_ROWS = ROOT / "tests" / "fixtures" / "smoke_rows.json"
# where it ran, how busy the machine was, how fast it went and what energy it took, not what it computed
MACHINE = ("device_name", "torch_version", "transformers_version", "cpu_cores", "load_before", "load_after",
           "batch_tokens_per_s", "energy_j")


def comparable_rows(df, columns: list[str] | None = None) -> list[dict]:
    """Every column but the timings and the machine (only `columns` when given: those the
    fixture pinned), rows in key order, as plain JSON values."""
    timings = [c for c in SCHEMA.names if c.startswith("time_") or c in MACHINE or c in ("ttft_s", "tpot_s")]
    rows = df.drop(columns=timings).sort_values("key")
    rows = rows if columns is None else rows[columns]
    rows = rows.astype({c: str for c in ("run", "target", "draft", "dataset")})
    return json.loads(rows.to_json(orient="records"))


@pytest.fixture(scope="module")
def ray_head():
    """A head started and stopped the way the README says (scripts/local_ray.sh): free ports,
    and a stop that leaves any other Ray on this machine alone."""
    if shutil.which("ray") is None:
        pytest.skip("the ray CLI is not installed")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_MODE", None)
    script = ["bash", str(ROOT / "scripts" / "local_ray.sh")]
    started = subprocess.run([*script, "start", "--num-cpus=2", "--num-gpus=1"], env=env, capture_output=True,
                             text=True, timeout=180)
    assert started.returncode == 0, started.stderr
    exported = dict(re.findall(r"(RAY_HEAD_PID|RAY_DASHBOARD|RAY_AUTH_MODE)=(\S+)", started.stdout))
    assert exported["RAY_AUTH_MODE"] == "token"  # authentication stays on
    env["RAY_AUTH_MODE"] = "token"  # as the `eval` of the start line exports it
    try:
        yield exported["RAY_DASHBOARD"], env
    finally:
        subprocess.run([*script, "stop", exported["RAY_HEAD_PID"]], env=env, timeout=120, check=True)
        assert subprocess.run(["kill", "-0", exported["RAY_HEAD_PID"]], capture_output=True).returncode != 0


@pytest.fixture(scope="module")
def smoke_results(ray_head, tmp_path_factory):
    """The smoke grid submitted with `ray job submit` to a local head with authentication on, as
    on a cluster: (results folder, the job's log). Later tests run the job locally on the same
    folder."""
    address, env = ray_head
    out, tiny = tmp_path_factory.mktemp("smoke"), tmp_path_factory.mktemp("tiny")
    runtime_env = {"env_vars": {"TABED_TINY_DIR": str(tiny), "HF_HUB_OFFLINE": "1",
                                "TRANSFORMERS_VERBOSITY": "error"}}
    job = subprocess.run(
        [
            "ray", "job", "submit", "--address", address, "--working-dir", ".",
            "--runtime-env-json", json.dumps(runtime_env), "--",
            "python", "jobs/full_grid.py", "--grid", "configs/smoke.yaml", "--out", str(out),
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
    )
    log = job.stdout + job.stderr
    assert job.returncode == 0 and "succeeded" in log, log[-3000:]
    return out, log


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
    assert "## Images" in summary and "Complete: all 368 expected rows are present" in summary
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
    assert calibration["rounds x repeats"].tolist() == ["5 x 10"] * 4 and calibration["Tq/Tp"].str.contains(r"\[").all()
    assert set(calibration["draft"]) == {"tiny:draft", "tiny:mamba_draft", "tiny:mamba2_draft", "tiny:eagle_head"}


def test_grid_rows_says_where_and_how_the_rows_ran(smoke_results):
    """`bench/grid_rows.py`, what a lent GPU's session reads off its smoke grid."""
    from bench.grid_rows import figures

    found = figures(smoke_results[0], "smoke")
    assert (found["rows"], found["failed"], found["lossless"]) == (368, 0, "304/304")
    assert found["lossless[tiny:target <- tiny:draft, fp32, static]"] == "96/96"
    assert found["lossless[tiny:bigram_target <- tiny:eagle_head, fp32, static]"] == "16/16"
    assert found["engine"] == "static x368" and found["fallback"] == "none x368"
    assert found["mode"] == "replay x270; ar x64; live x34" and found["device_name"].startswith("cpu")


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
    its report from the columns the report reads (the weights only of the rows drawn), and its
    report read one partition folder at a time, are, table for table and figure for figure, the
    report from every column of every row (the old way)."""
    from pipeline.reports.report_inputs import read_inputs
    from pipeline.reports.report_rows import read_report_rows
    from pipeline.reports.summary import write_summary
    from pipeline.storage.store import read_results, report_dir

    out, _ = smoke_results
    made = subprocess.run([sys.executable, "bench/scale.py", "--rows", "1000", "--template", str(out), "--steps", "",
                           "--work", str(tmp_path), "--log-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert made.returncode == 0 and "rows=1104" in made.stdout, made.stderr[-2000:]
    copy = tmp_path / "rows-1000"
    everything = read_results(copy, "smoke")
    assert len(everything) == 3 * 368 and everything["key"].is_unique

    def report(rows) -> tuple[str, dict[str, bytes]]:
        text = write_summary(copy, "smoke", rows)
        files = report_dir(copy, "smoke").iterdir()
        return text, {p.name: p.read_bytes() for p in files if p.suffix in (".md", ".csv", ".tex", ".png")}

    old, new = report(everything), report(read_report_rows(copy, "smoke"))
    assert "Complete: all 1104 expected rows are present" in new[0] and "weights.png" in new[1]
    assert new[0] == old[0] and new[1] == old[1]
    inputs = read_inputs(copy, "smoke")
    assert inputs.rows == 1104 and len(inputs.cells[["draft", "dataset"]].drop_duplicates()) > 1  # folders: one by one
    streamed = report(inputs)
    assert streamed[0] == old[0] and streamed[1] == old[1]


@pytest.mark.slow
def test_notebook_runs_headless_on_smoke_results(smoke_results, tmp_path):
    from tests.test_notebook import executed_notebook

    text, outputs = executed_notebook(smoke_results[0], tmp_path)
    assert "matches pipeline.reports.report.tau_table" in text and "run smoke, target tiny:bigram_target (fp32), drafts ['tiny:eagle_head', 'tiny:mamba2_draft', 'tiny:mamba_draft']" in text
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


@pytest.mark.slow
def test_ray_job_submit_runs_the_smoke_grid_with_authentication_on(ray_head, smoke_results):
    address, env = ray_head
    out, log = smoke_results
    spec = load_grid(ROOT / "configs" / "smoke.yaml")
    df = read_results(out)
    assert len(df) == len(spec.units()) * spec.limit and df.key.is_unique, log[-3000:]
    assert df.error.isna().all() and set(df.turn) == {"first", "qaorg"}
    assert f"run smoke: {len(df)} rows written" in log
    pinned = json.loads(SMOKE_ROWS.read_text())  # columns added since are checked for being filled
    assert comparable_rows(df, list(pinned[0])) == pinned
    assert df["prompt_tokens"].gt(0).all() and df["images"].ge(0).all()
    assert re.search(r"\[second turn\] (\d+)/\1 shards, (\d+)/\2 rows, [\d.]+ decodes/s, ETA 0:00:00", log), log[-3000:]
    assert "Loading weights" not in log and "it/s]" not in log  # no library progress bars in the job's log
    stranger = subprocess.run(["ray", "job", "list", "--address", address], cwd=ROOT, capture_output=True, text=True,
                              env={**env, "RAY_AUTH_TOKEN": "not-the-clusters-token"}, timeout=60)
    assert stranger.returncode != 0  # the job API refuses a client without the cluster's token
