"""`bench/gpu_profile.py`'s reading of a profiler trace (a GPU's trace cannot be made here, so
a hand-built one with known kernels and gaps), and the prepared GPU session on this CPU."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.gpu_profile import analyse

ROOT = Path(__file__).resolve().parents[1]


def trace_of(steps: int) -> dict:
    """An AR-like trace: a read of the prefill, then per 1000 us step one input copy at +0, ten
    50 us GEMVs from +10 (10 us apart), a 20 us fused kernel at +700, and the step's read at +900."""
    events = [dict(name="Memcpy DtoH (Device -> Pinned)", ts=0, dur=2, cat="gpu_memcpy", ph="X")]
    for step in range(steps):
        base = 100 + 1000 * step
        events.append(dict(name="Memcpy DtoD (Device -> Device)", ts=base, dur=2, cat="gpu_memcpy", ph="X"))
        events += [dict(name=f"nvjet_gemv_{i % 2}", ts=base + 10 + 60 * i, dur=50, cat="kernel", ph="X")
                   for i in range(10)]
        events.append(dict(name="triton_poi_fused_add_0", ts=base + 700, dur=20, cat="kernel", ph="X"))
        events.append(dict(name="Memcpy DtoH (Device -> Pinned)", ts=base + 900, dur=2, cat="gpu_memcpy",
                           ph="X"))
        events.append(dict(name="cudaGraphLaunch", ts=base + 5, dur=20, cat="cuda_runtime", ph="X"))
    return {"traceEvents": events}


def test_periods_busy_time_kinds_and_gaps_are_read_from_the_trace():
    lines = analyse(trace_of(3), "ar_step")
    figures = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    assert figures["ar_step_period_ms"] == "1.0000"  # read to read
    assert figures["ar_step_busy_ms"] == "0.5240"  # 10 x 50 + 20 + 2 + 2 us
    assert figures["ar_step_idle_ms"] == "0.4760"
    assert figures["ar_step_kernels_per_period"] == "13.0"
    text = "\n".join(lines)
    assert "gemm                    500.0   50.0%" in text and "fused (inductor)         20.0" in text
    assert "cudaGraphLaunch" in text  # the host's calls inside the periods
    # the largest gap: from the fused kernel's end to the step's read, then the host's own time
    gaps = lines[lines.index(next(line for line in lines if "by the kernel that ended them" in line)) + 1:]
    assert gaps[0].split() == ["#", "180.0", "1.0", "Memcpy", "DtoH", "(Device", "->", "Pinned)"]


def test_a_trace_without_device_kernels_says_so():
    assert analyse({"traceEvents": []}, "sd_block") == [
        "# sd_block: no device kernels in the trace (a CPU run): nothing to analyse"]


def test_the_gpu_session_installs_nothing_it_is_not_given_and_runs_its_profile_stage_on_a_cpu(tmp_path):
    """Its profile stage on tiny shapes (the smoke grid and the check are what
    tests/test_end_to_end.py and tests/test_gpu_check.py run; left out here to keep the suite short)."""
    run = subprocess.run([sys.executable, "bench/gpu_session.py", "--shapes", "tiny", "--stages", "profile",
                          "--budget-s", "120", "--log-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    session = next(tmp_path.glob("gpu-session-tiny-*.txt")).read_text()
    assert "device=cpu" in session and "version_transformers=" in session
    assert "target_step_ms=" in session and "sd_equals_ar=2/2" in session
    assert "# ar_step: no device kernels" in session
    assert list(tmp_path.glob("gpu-profile-tiny-cpu-*.txt")) and list(tmp_path.glob("*-ar_step.json.gz"))
