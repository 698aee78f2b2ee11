"""`bench/gpu_engine.py` end to end on the tiny pair: every number it promises is printed and
finite, fp32 SD reproduces AR in both engines, and the arranged draft agrees as asked."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_KEYS = [
    "target_step_ms", "verify_block_ms", "draft_step_ms_rows1", "draft_step_ms_rows2", "draft_step_ms_rows4",
    "ar_tokens_per_s", "sd_m_tokens_per_s", "sd_mt_star_tokens_per_s", "sd_mtcp_star_tokens_per_s",
    "sd_m_vs_hf_assisted", "sd_m_vs_our_ar", "tabed_overhead_share_m", "tabed_overhead_share_mt_star",
    "tabed_overhead_share_mtcp_star", "tau_m", "eq1_predicted_speedup", "measured_speedup_m",
]
KEYS = [
    "copy_bandwidth_gb_s", "floor_target_step_ms", "floor_draft_step_ms", "static_vs_eager_sd_m",
    "hf_greedy_dynamic_tokens_per_s", "hf_greedy_static_tokens_per_s", "hf_assisted_tokens_per_s",
    "measured_agreement", *(f"{e}_{k}" for e in ("static", "eager") for k in ENGINE_KEYS),
]


def test_tiny_run_prints_every_metric_and_sd_matches_ar():
    done = subprocess.run(
        [sys.executable, "bench/gpu_engine.py", "--shapes", "tiny", "--samples", "1", "--max-new-tokens", "16"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line and not line.startswith("#"))
    missing = [k for k in KEYS if k not in values]
    assert not missing, missing
    metrics = {k: float(v) for k, v in values.items()}
    assert all(math.isfinite(metrics[k]) and metrics[k] > 0 for k in KEYS if "share" not in k)
    assert all(0 <= metrics[k] < 1 for k in KEYS if "share" in k)
    assert metrics["static_sd_equals_ar"] == metrics["eager_sd_equals_ar"] == metrics["hf_greedy_equals_ar"] == 1
    assert abs(metrics["measured_agreement"] - 0.7) <= 0.2
    assert 1 < metrics["static_tau_m"] == metrics["eager_tau_m"] <= 6
