"""Latency calibration for the expected-speedup formula (paper Eq. 1) on the hardware at hand.

Eq. 1, tau / (gamma * Tq/Tp + 1), assumes a target forward over gamma+1 tokens costs what one
token costs — true on a GPU, not on a CPU. So we measure both ratios with the engine's own
cached-rows code and report Eq. 1 beside the corrected tau / (gamma * Tq/Tp + Tp(gamma+1)/Tp(1)).
Results live beside the results dataset in `OUT/_calibration/` (the underscore keeps
pyarrow's dataset discovery of the decoding results away from them).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

import pandas as pd
import torch
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import default_engine, new_rows
from pipeline.drafting.batch import BatchedRows
from pipeline.drafting.methods import method_embeddings
from pipeline.models.base import LVLM

CALIBRATION_DIR = "_calibration"
PROMPT = "USER: <image>\nDescribe the image in detail. ASSISTANT:"
MAX_ROWS = 4  # the largest ensemble (MTCP) drafts four rows per step


@dataclass
class Calibration:
    target: str
    draft: str
    device: str
    dtype: str
    gamma: int
    target_token_s: float  # Tp: one cached decode step of the target
    target_verify_s: float  # Tp(gamma+1): one target forward over gamma+1 tokens
    draft_token_s: float  # Tq: one cached decode step of the draft, one row
    draft_rows_token_s: list[float]  # Tq with 1..MAX_ROWS rows in the batch (ensembles)
    repeats: int
    engine: str = "eager"  # the decoding engine whose steps were timed (files from before engines: eager)

    @property
    def ratio_draft_target(self) -> float:
        return self.draft_token_s / self.target_token_s

    @property
    def ratio_verify(self) -> float:
        return self.target_verify_s / self.target_token_s


def expected_speedup(tau: float, gamma: int, ratio_draft_target: float, ratio_verify: float = 1.0) -> float:
    """Paper Eq. 1 when `ratio_verify` is 1; the CPU-corrected form otherwise."""
    return tau / (gamma * ratio_draft_target + ratio_verify)


def _step_seconds(model: LVLM, rows: BatchedRows, n_tokens: int, repeats: int, warmup: int = 3) -> float:
    """Median seconds of feeding `n_tokens` to the cached rows, rolled back after each try."""
    tokens = [model.tokenizer.eos_token_id or 0] * n_tokens
    base = rows.fed
    samples = []
    for i in range(warmup + repeats):
        model.synchronize()
        start = time.perf_counter()
        rows.feed(tokens, keep=n_tokens)
        model.synchronize()
        if i >= warmup:
            samples.append(time.perf_counter() - start)
        rows.keep_shared(base)
    return median(samples)


def _prefilled(model: LVLM, sample: Sample, n_rows: int, engine: str, gamma: int) -> BatchedRows:
    ids = model.tokenize_prompt(sample.prompt)
    embeds = method_embeddings(model, "M", ids, sample.images)
    rows = new_rows(model, [embeds] * n_rows, engine=engine, capacity=gamma + 2, role="calibration")
    rows.prefill()
    rows.feed(ids[-1:])
    return rows


@torch.inference_mode()
def calibrate(
    target: LVLM, draft: LVLM, *, gamma: int = DecodeConfig.gamma, repeats: int = 20, image: Image.Image | None = None,
    engine: str | None = None,
) -> Calibration:
    """Measure Tp, Tp(gamma+1) and Tq (1..4 rows) on an image prompt, medians after warm-up,
    with the steps of `engine` (None: the device's default, as decoding picks it)."""
    engine = engine or default_engine(target, draft)
    image = image or Image.new("RGB", (336, 336), (120, 80, 200))
    sample = Sample("calibration", "none", 0, "first", PROMPT, (image,))
    target_rows = _prefilled(target, sample, 1, engine, gamma)
    target_token = _step_seconds(target, target_rows, 1, repeats)
    target_verify = _step_seconds(target, target_rows, gamma + 1, repeats)
    draft_rows = [_step_seconds(draft, _prefilled(draft, sample, n, engine, gamma), 1, repeats) for n in range(1, MAX_ROWS + 1)]
    return Calibration(
        target=target.name,
        draft=draft.name,
        device=str(target.device),
        dtype=str(target.dtype).removeprefix("torch."),
        gamma=gamma,
        target_token_s=target_token,
        target_verify_s=target_verify,
        draft_token_s=draft_rows[0],
        draft_rows_token_s=draft_rows,
        repeats=repeats,
        engine=engine,
    )


def calibration_path(out: str | Path, target: str, draft: str) -> Path:
    safe = lambda name: name.replace("/", "__").replace(":", "_")
    return Path(out) / CALIBRATION_DIR / f"{safe(target)}--{safe(draft)}.parquet"


def write_calibration(out: str | Path, calibration: Calibration) -> Path:
    """One file per pair, replaced atomically: a re-run on other hardware overwrites it."""
    path = calibration_path(out, calibration.target, calibration.draft)
    path.parent.mkdir(parents=True, exist_ok=True)
    row = asdict(calibration) | {
        "ratio_draft_target": calibration.ratio_draft_target,
        "ratio_verify": calibration.ratio_verify,
    }
    tmp = path.with_name("." + path.name)
    pd.DataFrame([row]).to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def read_calibrations(out: str | Path) -> pd.DataFrame:
    """Every calibration under OUT (empty frame when none was run)."""
    files = sorted((Path(out) / CALIBRATION_DIR).glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
