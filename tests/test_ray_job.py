"""`ray job submit` of jobs/full_grid.py with configs/smoke.yaml against a local `ray start --head`.

The head runs as `ray start --block` in its own session on free ports, so the test never
touches another Ray on the machine and stops exactly the processes it started.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from ray._common.utils import get_ray_address_file

from pipeline.planning.grid_file import load_grid
from pipeline.results.schema import SCHEMA
from pipeline.results.store import read_results

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
# The smoke run's rows (timings left out): a refactor must not change a single value. Written
# before the layout moved into core / planning / cluster wings; rewritten when row keys came to
# include the prompt hash, and when walltime samples came to be chosen by seed (the `timed` and
# `replay_accepted_per_block` columns, modes and shard ids changed), checked equal on every
# other column each time; the `answer` column (null here) was added by hand.
SMOKE_ROWS = REPO / "tests" / "fixtures" / "smoke_rows.json"


def comparable_rows(df) -> list[dict]:
    """Every column but the timings, rows in key order, as plain JSON values."""
    rows = df.drop(columns=[c for c in SCHEMA.names if c.startswith("time_")]).sort_values("key")
    rows = rows.astype({c: str for c in ("run", "target", "draft", "dataset")})
    return json.loads(rows.to_json(orient="records"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, head: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start exited with {head.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"the Ray dashboard at {url} did not come up in {timeout} s")


@pytest.fixture
def ray_head(tmp_path):
    if shutil.which("ray") is None:
        pytest.skip("the ray CLI is not installed")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    dashboard, gcs_port = free_port(), free_port()
    head = subprocess.Popen(
        [
            "ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
            "--num-cpus=2", "--num-gpus=1", f"--port={gcs_port}", f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}", f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ],
        env=env, stdout=open(tmp_path / "head.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        wait_for(f"{address}/api/version", head)
        yield address, env
    finally:
        head.terminate()  # on SIGTERM, `ray start --block` drains and stops the processes it started
        try:
            head.wait(timeout=60)
        finally:
            try:  # anything of that session still alive
                os.killpg(head.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            head.wait()
            forget_cluster(gcs_port)


def forget_cluster(gcs_port: int) -> None:
    """`ray start` records its address for later `ray.init()` calls to join; drop the record of
    this (now stopped) head so they start their own Ray instead of failing to connect."""
    record = Path(get_ray_address_file(None))
    try:
        if record.read_text().strip().endswith(f":{gcs_port}"):
            record.unlink()
    except FileNotFoundError:
        pass


def test_ray_job_submit_runs_the_smoke_grid(ray_head, tmp_path):
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
    assert comparable_rows(df) == json.loads(SMOKE_ROWS.read_text())
    assert re.search(r"\[second turn\] (\d+)/\1 shards, \d+ samples, [\d.]+ samples/s, ETA 0:00:00", log), log[-3000:]
