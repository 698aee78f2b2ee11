"""`ray job submit` of jobs/full_grid.py with configs/smoke.yaml against a local `ray start --head`.

The head runs as `ray start --block` in its own session on free ports, so the test never
touches another Ray on the machine and stops exactly the processes it started.
"""
from __future__ import annotations

import json
import os
import shutil
import re
import subprocess
from pathlib import Path

import pytest

from pipeline.planning.grid_file import load_grid
from pipeline.storage.schema import SCHEMA
from pipeline.storage.store import read_results

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
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
# `verify_block_shapes` when one decoder came to serve every batch size.
SMOKE_ROWS = REPO / "tests" / "fixtures" / "smoke_rows.json"
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


@pytest.fixture
def ray_head():
    """A head started and stopped the way the README says (scripts/local_ray.sh): free ports,
    and a stop that leaves any other Ray on this machine alone."""
    if shutil.which("ray") is None:
        pytest.skip("the ray CLI is not installed")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_AUTH_MODE", None)
    script = ["bash", str(REPO / "scripts" / "local_ray.sh")]
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


def test_ray_job_submit_runs_the_smoke_grid_with_authentication_on(ray_head, tmp_path):
    address, env = ray_head
    out = tmp_path / "results"
    runtime_env = {"env_vars": {"TABED_TINY_DIR": str(tmp_path / "tiny"), "HF_HUB_OFFLINE": "1",
                                "TRANSFORMERS_VERBOSITY": "error"}}
    job = subprocess.run(
        [
            "ray", "job", "submit", "--address", address, "--working-dir", ".",
            "--runtime-env-json", json.dumps(runtime_env), "--",
            "python", "jobs/full_grid.py", "--grid", "configs/smoke.yaml", "--out", str(out),
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
    )
    log = job.stdout + job.stderr
    assert job.returncode == 0 and "succeeded" in log, log[-3000:]
    spec = load_grid(REPO / "configs" / "smoke.yaml")
    df = read_results(out)
    assert len(df) == len(spec.units()) * spec.limit and df.key.is_unique, log[-3000:]
    assert df.error.isna().all() and set(df.turn) == {"first", "qaorg"}
    assert f"run smoke: {len(df)} rows written" in log
    pinned = json.loads(SMOKE_ROWS.read_text())  # columns added since are checked for being filled
    assert comparable_rows(df, list(pinned[0])) == pinned
    assert df["prompt_tokens"].gt(0).all() and df["images"].ge(0).all()
    assert re.search(r"\[second turn\] (\d+)/\1 shards, (\d+)/\2 rows, [\d.]+ decodes/s, ETA 0:00:00", log), log[-3000:]
    assert "Loading weights" not in log and "it/s]" not in log  # no library progress bars in the job's log
    stranger = subprocess.run(["ray", "job", "list", "--address", address], cwd=REPO, capture_output=True, text=True,
                              env={**env, "RAY_AUTH_TOKEN": "not-the-clusters-token"}, timeout=60)
    assert stranger.returncode != 0  # the job API refuses a client without the cluster's token
