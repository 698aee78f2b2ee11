"""Shared fixtures: tiny locally built models (never a download)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# the suite runs two workers on two cores: a subprocess (a job, a bench script) computing with two
# threads on a core the other worker holds crawls (the GPU check's CPU run: 2x slower)
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny tensors: OpenMP start-up dominates and stalls on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Directories of the tiny models (`pipeline.models.tiny`: target, draft, LLaVA-NeXT target,
    the bigram target and its Mamba / Mamba2 drafts, a pair of each of `TINY_FAMILIES`), built
    once per session."""
    from pipeline.models.tiny import build_tiny_pair
    from pipeline.planning.model_ids import TINY_MODELS

    out = tmp_path_factory.mktemp("tiny_models")
    build_tiny_pair(out)
    return {name: str(out / name) for name in TINY_MODELS}


@pytest.fixture(scope="session")
def tiny_pair(tiny_dirs):
    from pipeline.models.loading import load_pair

    return load_pair(tiny_dirs["target"], tiny_dirs["draft"])


def solid(rgb, size=(64, 48)) -> Image.Image:
    """A plain test image; distinct colours give distinct image features."""
    return Image.new("RGB", size, rgb)


class FixedCaptioner:
    """Test double for the caption model: the engine's C transform is what is under test."""

    def __init__(self) -> None:
        self.calls = 0

    def caption(self, image: Image.Image) -> str:
        self.calls += 1
        r, g, b = image.resize((1, 1)).getpixel((0, 0))
        return "a red square" if r >= max(g, b) else "a blue circle"


ROOT = Path(__file__).resolve().parents[1]
OWN_KIND = "tests.test_own_verify_kind:OneMethodChain"  # a verify kind of one's own, by import path


@pytest.fixture(scope="session")
def batch_sweep_run(tmp_path_factory):
    """The job on a small batch sweep of the tiny pair, one run serving the batch tests and the
    own-kind tests: AR, M and MT* chains, the MT* candidate tree and MT* verified by a kind of
    one's own (`tests/test_own_verify_kind.py`), at batch 1 and 2 over three requests (the last
    batch of 2 holds one), live, calibrated. Returns (OUT, the job's stdout, the grid)."""
    import yaml

    from pipeline.planning.grid_file import parse_grid

    folder = tmp_path_factory.mktemp("batch_sweep")
    raw = {"name": "sweep", "datasets": ["embedded_describe"], "turns": ["first"],
           "pairs": [{"target": "tiny:target", "draft": "tiny:draft", "dtype": "fp32"}], "methods": ["AR", "M", "MT"],
           "policies": [{"kind": "grid", "measure": "hard+soft"}], "gamma": [3],
           "verify": ["chain", "candidates", {"kind": OWN_KIND, "method": 1, "methods": ["MT"]}],
           "batch": [1, 2], "max_new_tokens": 12, "limit": 3, "shard_size": 2, "mode": "live", "calibrate": True,
           "calibrate_rounds": 2, "calibrate_repeats": 3}
    (folder / "sweep.yaml").write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "jobs/full_grid.py", "--grid", str(folder / "sweep.yaml"), "--out", str(folder / "out")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "out", done.stdout, parse_grid(raw)
