"""`bench/gpu_check.py` on this CPU: every section it can run in its budget, the rest named
`unmeasured` with the reason, a raw log written; a short budget stops in time naming what it skipped."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check(tmp_path: Path, budget: int, family: str = "llava") -> tuple[dict[str, str], str, float]:
    start = time.monotonic()
    run = subprocess.run([sys.executable, "bench/gpu_check.py", "--shapes", "tiny", "--budget-s", str(budget),
                          "--max-new-tokens", "16", "--log-dir", str(tmp_path), "--family", family],
                         cwd=ROOT, capture_output=True, text=True, timeout=budget + 60)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line and not line.startswith("#"))
    named = "" if family == "llava" else family.replace("_", "-") + "-"
    logs = list(tmp_path.glob(f"gpu-check-{named}tiny-cpu-*.txt"))
    assert len(logs) == 1 and logs[0].read_text().splitlines()[-2] == run.stdout.splitlines()[-2]
    return figures, logs[0].read_text(), time.monotonic() - start


def test_every_section_runs_on_a_cpu_and_says_what_it_cannot_measure(tmp_path):
    figures, log, _ = check(tmp_path, 480)  # room for a busy machine (the suite runs two workers)
    assert figures["skipped"] == "none" and "# device: cpu" in log and figures["exact_family"] == "llava"
    assert figures["gpu_tests"].startswith("unmeasured (no CUDA")
    # the head section: a real-shaped EAGLE head's figures, its outputs the target's own
    assert figures["head_chain_equals_ar"] == figures["head_eagle2_equals_ar"] == "3/3"
    assert float(figures["head_tau_chain"]) > 1 and float(figures["head_step_ms"]) > 0
    for dtype in ("fp32", "fp16"):  # greedy SD = AR for every verify kind, batch 1 and 3
        equal, total = map(int, figures[f"exact_{dtype}"].split("/"))
        assert equal == total == 24
    assert 0 <= float(figures["bf16_divergence"]) <= 1
    assert float(figures["target_step_ms"]) > float(figures["floor_ms"]) > 0
    assert float(figures["sd_speedup_M"]) > 0 and float(figures["hf_assisted_speedup"]) > 0
    assert figures["sd_equals_ar"] == "3/3" and figures["hf_assisted_equals_hf_ar"] == "3/3"
    assert figures["energy"].startswith("unmeasured (no NVML")  # never a zero
    assert not any(name.startswith("energy_j") for name in figures)
    assert all(float(figures[f"batch_speedup_{b}"]) > 0 for b in (1, 2, 4))
    assert all(figures[f"batch_{b}_sd_equals_ar"] == "4" for b in (1, 2, 4))
    assert float(figures["ssm_step_ms"]) > 0 and float(figures["llama_draft_step_ms"]) > 0
    assert figures["spread"] == "unmeasured (0 GPUs here: spreading a target takes two)"
    assert not [name for name, value in figures.items() if value.startswith("unmeasured (")
                and name not in ("gpu_tests", "energy", "spread")]


def test_a_short_budget_stops_in_time_and_names_what_it_skipped(tmp_path):
    figures, log, seconds = check(tmp_path, 20)
    assert seconds < 20 + 15  # the last section is stopped at the budget; start-up and the log are extra
    skipped = figures["skipped"].split(",")
    assert skipped != ["none"] and skipped[-1] == "gpu_tests"
    stopped = [name for name, value in figures.items() if value.startswith("unmeasured (out of time")]
    assert all(name not in skipped for name in stopped)


def test_the_qwen2_5_vl_check_runs_its_own_pair_on_a_cpu(tmp_path):
    """`--family qwen2_5_vl`: the exact section on the tiny Qwen2.5-VL pair, the decode section on
    a Qwen2.5-VL pair of the tiny shapes arranged as the 7B one would be, beside transformers'
    own `generate` and assisted generation fed what Qwen's processor would write."""
    figures, log, _ = check(tmp_path, 480, family="qwen2_5_vl")
    assert "--family qwen2_5_vl" in log and figures["skipped"] == "none"
    assert figures["exact_family"] == "qwen2_5_vl"
    assert figures["decode_pair"] == "qwen2_5_vl-tiny-target <- qwen2_5_vl-tiny-draft"
    assert figures["exact_fp32"] == figures["exact_fp16"] == "24/24"
    assert figures["sd_equals_ar"] == "3/3" and figures["hf_assisted_equals_hf_ar"] == "3/3"
    assert all(figures[f"batch_{b}_sd_equals_ar"] == "4" for b in (1, 2, 4))
    assert float(figures["sd_speedup_M"]) > 0 and float(figures["target_step_ms"]) > 0
    assert figures["head"] == "unmeasured (the head section has LLaVA shapes only, not qwen2_5_vl's)"


def test_the_spread_section_compares_the_target_on_one_gpu_with_it_spread(monkeypatch):
    """On two GPUs it spreads the target with the loader's own plan; on this CPU, with the plan
    replaced by the only device there is, its comparison and speed lines come out, and the one
    target decodes the same either way."""
    from bench import gpu_check, gpu_sections
    from pipeline.models import sharding

    monkeypatch.setattr(sharding, "gpu_budgets", lambda gpus: dict.fromkeys(range(gpus), 1 << 40))
    monkeypatch.setattr(sharding, "plan_device_map", lambda model, budgets, name: {"": "cpu"})
    args = gpu_check.parse_args(["--shapes", "tiny", "--family", "qwen2_5_vl", "--max-new-tokens", "8"])
    figures = dict(gpu_sections.spread_section(args))
    assert figures["spread_ar_equals_one_gpu"] == figures["spread_sd_equals_one_gpu"] == "3/3"
    assert all(figures[f"{where}_{decode}_tokens_per_s"] > 0 for where in ("one_gpu", "spread")
               for decode in ("ar", "sd"))
