"""Latency calibration for the expected-speedup formula (paper Eq. 1) on the hardware at hand.

Eq. 1, tau / (gamma * Tq/Tp + 1), assumes a target forward over gamma+1 tokens costs what one
token costs — true on a GPU, not on a CPU. So we measure both ratios with the engine's own
cached-rows code and report Eq. 1 beside the corrected tau / (gamma * Tq/Tp + Tp(gamma+1)/Tp(1)).
The verify cost is measured for every token count a grid verifies (gamma + 1 for each of its
gammas): a curve of Tp(n)/Tp(1), so each gamma's speedup uses its own verify cost.
`pipeline.results.calibration_store` keeps the results beside the results dataset.

A CPU shared with other work drifts by tens of percent between minutes, so one measurement
is not enough: `calibrate` measures target and draft alternately in several rounds, the
ratios of each round taken from steps timed seconds apart, and keeps every round's ratio;
reports give the median and the range.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from statistics import median
from typing import Callable, Sequence

import torch
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import default_engine, new_rows
from pipeline.decoding.rows import Rows
from pipeline.drafting.methods import method_embeddings
from pipeline.models.base import LVLM
from pipeline.models.devices import cpu_cores, device_name, machine_load

PROMPT = "USER: <image>\nDescribe the image in detail. ASSISTANT:"
MAX_ROWS = 4  # the largest ensemble (MTCP) drafts four rows per step


@dataclass
class Calibration:
    target: str
    draft: str
    device: str
    dtype: str
    gamma: int  # the largest gamma measured: target_verify_s and ratio_verify_rounds are its verify's
    target_token_s: float  # Tp: one cached decode step of the target
    target_verify_s: float  # Tp(gamma+1): one target forward over gamma+1 tokens
    draft_token_s: float  # Tq: one cached decode step of the draft, one row
    draft_rows_token_s: list[float]  # Tq with each of `draft_row_counts` rows in the batch (ensembles, trees)
    repeats: int  # timed steps per measurement, after warm-up; the median is kept
    engine: str = "eager"  # the decoding engine whose steps were timed (files from before engines: eager)
    rounds: int = 1  # times every measurement was repeated, target and draft alternating
    ratio_draft_target_rounds: list[float] = field(default_factory=list)  # Tq/Tp of each round
    ratio_verify_rounds: list[float] = field(default_factory=list)  # Tp(gamma+1)/Tp of each round
    draft_rows_ratio: list[float] = field(default_factory=list)  # Tq(m rows)/Tp, median over rounds, per draft_row_counts
    measured_at: str = ""  # UTC, ISO 8601
    device_name: str = ""  # e.g. NVIDIA H100 80GB HBM3 (pipeline.models.devices)
    # the verify-latency curve: token counts n fed in one target forward, the median seconds and
    # the median over rounds of Tp(n)/Tp(1) for each
    verify_tokens: list[int] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    verify_ratios: list[float] = field(default_factory=list)
    draft_row_counts: list[int] = field(default_factory=list)  # rows timed (files from before it: 1..MAX_ROWS)
    # every round's ratio, not only the median: per verify_tokens entry Tp(n)/Tp, per
    # draft_row_counts entry Tq(m rows)/Tp (pipeline.results.noise judges their spread)
    verify_ratio_rounds: list[list[float]] = field(default_factory=list)
    draft_rows_ratio_rounds: list[list[float]] = field(default_factory=list)
    # the machine's 1-minute load average before and after measuring, and its cores
    load_before: float | None = None
    load_after: float | None = None
    cpu_cores: int | None = None
    # one cached step of the target and of the draft (one row) after prompts of `context_tokens`
    # tokens, medians over rounds: how each step's cost grows with the context
    context_tokens: list[int] = field(default_factory=list)
    context_target_s: list[float] = field(default_factory=list)
    context_draft_s: list[float] = field(default_factory=list)

    @property
    def ratio_draft_target(self) -> float:
        return median(self.ratio_draft_target_rounds) if self.ratio_draft_target_rounds else self.draft_token_s / self.target_token_s

    @property
    def ratio_verify(self) -> float:
        return median(self.ratio_verify_rounds) if self.ratio_verify_rounds else self.target_verify_s / self.target_token_s


def expected_speedup(tau: float, gamma: int, ratio_draft_target: float, ratio_verify: float = 1.0) -> float:
    """Paper Eq. 1 when `ratio_verify` is 1; the CPU-corrected form otherwise."""
    return tau / (gamma * ratio_draft_target + ratio_verify)


def _step_seconds(model: LVLM, rows: Rows, n_tokens: int, repeats: int, warmup: int = 3) -> float:
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


def _prefilled_context(model: LVLM, tokens: int, engine: str) -> Rows:
    """One row holding a text prompt of `tokens` tokens (words of the tokenizer, repeated)."""
    words = model.tokenizer("describe the picture in detail, the colors and the shapes. " * 64,
                            add_special_tokens=False)["input_ids"]
    ids = (words * (tokens // len(words) + 1))[:tokens]
    rows = new_rows(model, [model.embed_tokens(torch.tensor(ids[:-1]))], engine=engine, capacity=4, role="context", span=2)
    rows.prefill()
    rows.feed(ids[-1:])
    return rows


def _fits(model: LVLM, tokens: int) -> bool:
    """Whether a prompt of `tokens` tokens and a few steps fit the model's context (no limit: yes)."""
    return model.max_positions is None or tokens + 8 <= model.max_positions


def _prefilled(model: LVLM, sample: Sample, n_rows: int, engine: str, gamma: int) -> Rows:
    ids = model.tokenize_prompt(sample.prompt)
    embeds = method_embeddings(model, "M", ids, sample.images)
    rows = new_rows(model, [embeds] * n_rows, engine=engine, capacity=gamma + 2, role="calibration")
    rows.prefill()
    rows.feed(ids[-1:])
    return rows


@torch.inference_mode()
def calibrate(target: LVLM, draft: LVLM, **options) -> Calibration:
    """One pair's calibration (`calibrate_drafts` with one draft)."""
    return calibrate_drafts(target, [draft], **options)[0]


@torch.inference_mode()
def calibrate_drafts(
    target: LVLM, drafts: Sequence[LVLM], *, gammas: Sequence[int] = (DecodeConfig.gamma,), repeats: int = 10,
    rounds: int = 5, image: Image.Image | None = None, engine: str | None = None, verify_tokens: Sequence[int] = (),
    draft_rows: Sequence[int] = (), progress: Callable[[int, int, float], None] | None = None,
    contexts: Sequence[int] = (),
) -> list[Calibration]:
    """Measure Tp, Tp(n) for n = gamma + 1 of every gamma and every other of `verify_tokens`
    (a tree's nodes + 1: the verify-latency curve), and for each draft Tq with 1..4 rows and
    every other of `draft_rows` (a tree's draft batch) on an image prompt, in `rounds` rounds,
    each the median of `repeats` steps after warm-up, with the steps of `engine` (None: the
    device's default, as decoding picks it); and one step of each after text prompts of
    `contexts` tokens (those that fit). The target is measured once per round for all its
    drafts, each draft right after it, so every pair's ratios come from steps timed seconds
    apart. Times are medians over rounds; ratios are the medians of each round's ratios.
    `progress(round, rounds, the first draft's Tq/Tp that round)` is called after each round."""
    load_before = machine_load()
    engine = engine or default_engine(target, *drafts)
    image = image or Image.new("RGB", (336, 336), (120, 80, 200))
    sample = Sample("calibration", "none", 0, "first", PROMPT, (image,))
    gamma = max(gammas)
    sizes = sorted({g + 1 for g in gammas} | set(verify_tokens))
    counts = sorted(set(range(1, MAX_ROWS + 1)) | set(draft_rows))
    target_rows = _prefilled(target, sample, 1, engine, max(sizes))
    target_lengths = [n for n in sorted(set(contexts)) if _fits(target, n)]
    target_long = {n: _prefilled_context(target, n, engine) for n in target_lengths}
    batches = [[_prefilled(draft, sample, n, engine, gamma) for n in counts] for draft in drafts]
    lengths = [[n for n in target_lengths if _fits(draft, n)] for draft in drafts]
    long_prompts = [{n: _prefilled_context(draft, n, engine) for n in mine} for draft, mine in zip(drafts, lengths)]
    token, verify, at_length = [], [], []
    measured = [([], []) for _ in drafts]  # per draft: its step per batch, its step per context, each round
    for done in range(1, rounds + 1):
        token.append(_step_seconds(target, target_rows, 1, repeats))
        verify.append([_step_seconds(target, target_rows, n, repeats) for n in sizes])
        at_length.append({n: _step_seconds(target, rows, 1, repeats) for n, rows in target_long.items()})
        for draft, mine, long, (steps, context_steps) in zip(drafts, batches, long_prompts, measured):
            steps.append([_step_seconds(draft, rows, 1, repeats) for rows in mine])
            context_steps.append({n: _step_seconds(draft, rows, 1, repeats) for n, rows in long.items()})
        if progress:
            progress(done, rounds, measured[0][0][-1][0] / token[-1])
    curve = [[v[i] / t for v, t in zip(verify, token)] for i in range(len(sizes))]
    at_gamma = sizes.index(gamma + 1)
    shared = dict(
        target=target.name, device=str(target.device), dtype=str(target.dtype).removeprefix("torch."), gamma=gamma,
        target_token_s=median(token), target_verify_s=median(v[at_gamma] for v in verify), repeats=repeats,
        engine=engine, rounds=rounds, ratio_verify_rounds=curve[at_gamma],
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), device_name=device_name(target.device),
        verify_tokens=sizes, verify_s=[median(v[i] for v in verify) for i in range(len(sizes))],
        verify_ratios=[median(r) for r in curve], draft_row_counts=counts, verify_ratio_rounds=curve,
        load_before=load_before, load_after=machine_load(), cpu_cores=cpu_cores(),
    )
    results = []
    for draft, mine, (steps, context_steps) in zip(drafts, lengths, measured):
        rows_ratio = [[d[m] / t for d, t in zip(steps, token)] for m in range(len(counts))]
        results.append(Calibration(
            draft=draft.name, draft_token_s=median(d[0] for d in steps),
            draft_rows_token_s=[median(d[m] for d in steps) for m in range(len(counts))],
            ratio_draft_target_rounds=rows_ratio[0], draft_rows_ratio=[median(r) for r in rows_ratio],
            draft_rows_ratio_rounds=rows_ratio, context_tokens=mine,
            context_target_s=[median(r[n] for r in at_length) for n in mine],
            context_draft_s=[median(r[n] for r in context_steps) for n in mine], **shared,
        ))
    return results
