"""The Spec-Bench export round-trips through a reader written from Spec-Bench's own format
(evaluation/speed.py reads `choices[0]`'s `new_tokens`, `wall_time` and `accept_lengths`, and
filters by `category`): its mean accepted tokens is our tau, its tokens per second ours."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.decoding.config import DecodeConfig
from pipeline.reports.export import export

ROOT = Path(__file__).resolve().parents[1]


def row(mode: str, label: str, sample: int, accepted: list[int], wall: float, *, dataset="pope", draft="d") -> dict:
    tokens = len(accepted) + sum(accepted)
    return {"target": "org/target", "draft": draft, "dtype": "fp16", "mode": mode, "method_label": label,
            "verify": None if mode == "ar" else "chain", "sample_id": f"{dataset}/test/{sample}/first",
            "dataset": dataset, "error": None, "output_text": f"answer {sample}", "new_tokens": tokens,
            "accepted_per_block": accepted, "time_wall_s": wall, "time_total_s": wall * 0.9}


def speed_bench_reader(path: Path, task: str = "overall") -> tuple[float, float]:
    """Spec-Bench's reading of a model_answer file: (mean accepted tokens, mean tokens per second)."""
    speeds, accept = [], []
    for line in path.read_text().splitlines():
        point = json.loads(line)
        if task != "overall" and point["category"] != task:
            continue
        choice = point["choices"][0]
        speeds.append(sum(choice["new_tokens"]) / sum(choice["wall_time"]))
        accept.extend(choice["accept_lengths"])
    return float(np.mean(accept)), float(np.mean(speeds))


def test_the_spec_bench_export_round_trips(tmp_path):
    rows = pd.DataFrame([
        row("live", "MT*", 0, [3, 1, 4], 0.5), row("live", "MT*", 1, [0, 2], 0.25, dataset="vist"),
        row("ar", "AR", 0, [0] * 6, 1.0), row("ar", "AR", 0, [0] * 6, 1.0, draft="other"),  # one AR row per target
        row("replay", "MT*", 2, [5, 5], 0.0),  # no walltime of its own: not exported
    ])
    written = export(rows, tmp_path)
    assert sorted(p.name for p in written) == ["org%2Ftarget__d__fp16__MT%2A.jsonl", "org%2Ftarget__fp16__AR.jsonl"]
    sd, ar = (tmp_path / name for name in ("org%2Ftarget__d__fp16__MT%2A.jsonl", "org%2Ftarget__fp16__AR.jsonl"))
    accept, speed = speed_bench_reader(sd)
    assert accept == pytest.approx(1 + (3 + 1 + 4 + 0 + 2) / 5)  # our pooled tau
    assert speed == pytest.approx(np.mean([11 / 0.5, 4 / 0.25]))
    assert speed_bench_reader(sd, task="vist") == pytest.approx((1 + 2 / 2, 4 / 0.25))
    assert len(ar.read_text().splitlines()) == 1 and speed_bench_reader(ar)[1] == pytest.approx(6.0)


def test_the_export_job_writes_beside_the_run(tmp_path):
    from pipeline.storage.schema import make_row
    from pipeline.storage.store import rows_to_table, write_shard
    from tests.test_run_safety import PAIR, RunConfig, sample
    from tests.test_results import record

    rec = record("toy/test/0/first")
    rec.mode, rec.time_wall_s = "live", 0.3
    write_shard(tmp_path, rows_to_table([make_row("r", "s1", RunConfig(PAIR, DecodeConfig("M")), sample(0), rec)]))
    done = subprocess.run([sys.executable, "jobs/export.py", str(tmp_path), "--format", "spec-bench"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "run r: 1 file(s)" in done.stdout, done.stderr
    (exported,) = (tmp_path / "_export-r" / "spec-bench").iterdir()
    assert json.loads(exported.read_text())["choices"][0]["accept_lengths"] == [3, 1]


def test_a_row_written_before_the_wall_clock_exports_its_phase_total(tmp_path):
    old = {**row("live", "M", 0, [1], 0.0), "time_wall_s": float("nan"), "time_total_s": 0.4}
    (written,) = export(pd.DataFrame([old]), tmp_path)
    assert json.loads(written.read_text())["choices"][0]["wall_time"] == [0.4]  # never NaN, which is not JSON
