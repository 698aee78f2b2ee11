"""Shared fixtures: tiny locally built models (never a download)."""
from __future__ import annotations

import os

import pytest
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


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
    the bigram target and its Mamba / Mamba2 drafts), built once per session."""
    from pipeline.models.tiny import build_tiny_pair

    out = tmp_path_factory.mktemp("tiny_models")
    build_tiny_pair(out)
    return {name: str(out / name) for name in ("target", "draft", "next_target", "bigram_target", "mamba_draft",
                                               "mamba2_draft")}


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
