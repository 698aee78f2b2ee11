"""`--format speculation-profile` read as its consumers read it: specdec_bench's schema 1.0
(histogram keyed by acceptance length, the bonus token counted; conditional and marginal vectors
indexed by draft position, position i <-> length i + 2; both validations), vLLM's synthetic
sampler (the marginal vector: P(first i + 1 drafts accepted), non-increasing, mean accept length
1 + their sum) and Dynamo's mocker (the conditional vector, whose running product is the
marginal one)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.reports.export import export
from pipeline.reports.speculation_profile import profile

ROOT = Path(__file__).resolve().parents[1]


def row(accepted: list[int], *, mode="replay", label="M", dataset="pope", sample=0, gamma=3, **extra) -> dict:
    return {"target": "org/target", "draft": "/scratch/team/drafts/my-draft", "dtype": "fp16", "mode": mode,
            "method_label": label, "policy": "static", "verify": None if mode == "ar" else "chain",
            "gamma": None if mode == "ar" else gamma, "temperature": 0.0,
            "sample_id": f"{dataset}/test/{sample}/first",
            "dataset": dataset, "turn": "first", "run": "r", "engine": "static", "device_name": "cpu",
            "error": None, "accepted_per_block": accepted, "batch": 1, **extra}


def profiles(tmp_path: Path, rows: list[dict]) -> dict[str, dict]:
    written = export(pd.DataFrame(rows), tmp_path, "speculation-profile")
    return {str(path.relative_to(tmp_path).parent): json.loads(path.read_text()) for path in written}


def test_a_profile_holds_the_schema_vectors_and_means(tmp_path):
    rows = [row([3, 0, 1], sample=0), row([2, 3], mode="live", sample=1, dataset="mmvet"),
            row([0] * 4, mode="ar", label="AR", sample=0),  # no draft: no profile
            row([3, 3], sample=2, error="boom"), row([3, 3, 3], sample=3, batch=4)]  # failed; batched
    (cell, made), = profiles(tmp_path, rows).items()
    assert cell == ("org%2Ftarget__%2Fscratch%2Fteam%2Fdrafts%2Fmy-draft__fp16/"
                    "M__static__chain__gamma-3__temperature-0.0")
    assert made["schema_version"] == "1.0" and made["measured"] is True and made["method"] == "M"
    assert made["draft_checkpoint"] == {"id": "drafts/my-draft"}  # a local path: its last two parts only
    assert made["target_model"] == {"id": "org/target"} and made["num_speculative_tokens"] == 3
    # steps accepting 3, 0, 1, 2, 3 drafts: lengths 4, 1, 2, 3, 4
    assert made["acceptance_length_histogram"] == {"1": 1, "2": 1, "3": 1, "4": 2}
    assert made["marginal_accept_rates"] == pytest.approx([4 / 5, 3 / 5, 2 / 5])
    assert made["conditional_accept_rates"] == pytest.approx([4 / 5, 3 / 4, 2 / 3])
    assert made["mean_accept_length"] == pytest.approx(1 + 9 / 5)  # our pooled tau
    assert made["mean_accept_length_per_request"] == pytest.approx(((1 + 4 / 3) + (1 + 5 / 2)) / 2)
    assert made["per_category"]["mmvet"]["mean_accept_length"] == pytest.approx(1 + 5 / 2)
    assert made["measurement_conditions"]["modes"] == {"replay": 1, "live": 1}  # replayed rows count
    checks = made["validation"]
    assert checks["mean_consistency"]["passed"] and checks["marginal_monotonicity"]["passed"]


def test_vllm_and_dynamo_read_the_same_acceptance(tmp_path):
    rows = [row([5, 2, 0, 4, 1, 5], gamma=5), row([3, 3], sample=1, gamma=5)]
    made = next(iter(profiles(tmp_path, rows).values()))
    marginal, conditional = made["marginal_accept_rates"], made["conditional_accept_rates"]
    assert len(marginal) == len(conditional) == 5
    assert all(later <= earlier for earlier, later in zip(marginal, marginal[1:]))  # vLLM refuses a rise
    assert 1 + sum(marginal) == pytest.approx(made["mean_accept_length"], abs=1e-5)  # vLLM's mean length
    running = [math.prod(conditional[: i + 1]) for i in range(5)]  # Dynamo's mocker, position by position
    assert running == pytest.approx(marginal, abs=1e-5)


def test_a_draft_depth_cut_short_fails_the_consistency_check():
    made = profile({"target": "t", "draft": "d", "dtype": "fp32", "method_label": "M", "policy": "static",
                    "verify": "chain", "gamma": 2, "temperature": 0.0},
                   pd.DataFrame([row([4, 4, 0], gamma=2)]))  # accepted beyond the 2 positions published
    assert not made["validation"]["mean_consistency"]["passed"]


def test_a_tree_is_its_own_cell_measured_at_its_deepest_shape(tmp_path):
    rows = [row([2, 1]), row([4, 0], verify="bandit", gamma=6, verify_shapes=[[4, 2, 1, 1], [2, 1]])]
    made = profiles(tmp_path, rows)
    tree = next(p for cell, p in made.items() if "bandit" in cell)
    assert tree["num_speculative_tokens"] == 6 and tree["verification_method"] == "tree"
    assert tree["accept_length_model"] == "measured_per_k"  # a tree's vectors do not extrapolate over K
    chain = next(p for cell, p in made.items() if "chain" in cell)
    assert chain["verification_method"] == "longest_prefix"
    assert chain["accept_length_model"] == "chain_analytic"


def test_the_export_job_writes_one_profile_per_configuration(tmp_path):
    from pipeline.decoding.config import DecodeConfig
    from pipeline.storage.schema import make_row
    from pipeline.storage.store import rows_to_table, write_shard
    from tests.test_results import record
    from tests.test_run_safety import PAIR, RunConfig, sample

    rec = record("toy/test/0/first")
    rec.mode = "replay"
    made = make_row("r", "s1", RunConfig(PAIR, DecodeConfig("M")), sample(0), rec)
    write_shard(tmp_path, rows_to_table([made]))
    command = [sys.executable, "jobs/export.py", str(tmp_path), "--format", "speculation-profile"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "run r: 1 file(s)" in done.stdout, done.stderr
    (written,) = (tmp_path / "_export-r" / "speculation-profile").rglob("speculation_profile.json")
    assert json.loads(written.read_text())["acceptance_length_histogram"] == {"1": 1, "3": 1}  # 2, then 0
