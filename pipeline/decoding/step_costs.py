"""Latency calibration, measured beside the engine it times, for the expected-speedup formula
(paper Eq. 1) on the hardware at hand.

Eq. 1, tau / (gamma * Tq/Tp + 1), assumes a target forward over gamma+1 tokens costs what one
token costs — true on a GPU, not on a CPU. So we measure both ratios with the engine's own
cached-rows code and report Eq. 1 beside the corrected tau / (gamma * Tq/Tp + Tp(gamma+1)/Tp(1)).
The verify cost is measured for every token count a grid verifies (gamma + 1 for each of its
gammas): a curve of Tp(n)/Tp(1), so each gamma's speedup uses its own verify cost.
The result is a `pipeline.decoding.calibration.Calibration`; `pipeline.storage.calibration_store`
keeps it beside the results dataset.

A CPU shared with other work drifts by tens of percent between minutes, so one measurement
is not enough: `calibrate` measures target and draft alternately in several rounds, the
ratios of each round taken from steps timed seconds apart, and keeps every round's ratio;
reports give the median and the range.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from statistics import median
from typing import Callable, Sequence

import torch
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.calibration import MAX_ROWS, Calibration
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import default_engine, head_prompt_states, new_rows
from pipeline.decoding.rows_protocol import Rows
from pipeline.drafting.methods import method_embeddings
from pipeline.models.base import LVLM
from pipeline.models.devices import cpu_cores, device_name, machine_load

PROMPT = "USER: <image>\nDescribe the image in detail. ASSISTANT:"


def _step_seconds(model: LVLM, rows: Rows, n_tokens: int, repeats: int, warmup: int = 3) -> float:
    """Median seconds of feeding `n_tokens` to the cached rows, rolled back after each try."""
    tokens = [model.tokenizer.eos_token_id or 0] * n_tokens
    samples = []
    for i in range(warmup + repeats):
        model.synchronize()
        start = time.perf_counter()
        rows.feed(tokens, keep=n_tokens)
        model.synchronize()
        if i >= warmup:
            samples.append(time.perf_counter() - start)
        rows.settle([0] * rows.rows)  # back to where the tries began
    return median(samples)


def _prefilled_context(model: LVLM, tokens: int, engine: str) -> Rows:
    """One row holding a text prompt of `tokens` tokens (words of the tokenizer, repeated)."""
    words = model.tokenizer("describe the picture in detail, the colors and the shapes. " * 64,
                            add_special_tokens=False)["input_ids"]
    ids = (words * (tokens // len(words) + 1))[:tokens]
    prompt = model.embed_tokens(torch.tensor(ids[:-1]))
    rows = _new_rows(model, [prompt], engine, capacity=4, role="context", span=2)
    rows.prefill()
    rows.feed(ids[-1:])
    rows.settle([1])
    return rows


def _new_rows(model: LVLM, prompts: list[torch.Tensor], engine: str, **options) -> Rows:
    """The model's rows over `prompts` (a head's, alone or beside a lookup, read its target's states
    there, from an untimed prefill)."""
    reads = getattr(model, "model_draft", model).drafter == "head"
    states = head_prompt_states(model, prompts, engine) if reads else None
    return new_rows(model, prompts, engine=engine, target_states=states, **options)


def _fits(model: LVLM, tokens: int) -> bool:
    """Whether a prompt of `tokens` tokens and a few steps fit the model's context (no limit: yes)."""
    return model.max_positions is None or tokens + 8 <= model.max_positions


def _prefilled(model: LVLM, sample: Sample, n_rows: int, engine: str, gamma: int) -> Rows:
    ids = model.tokenize_prompt(sample.prompt)
    embeds = method_embeddings(model, "M", ids, sample.pixels())
    rows = _new_rows(model, [embeds] * n_rows, engine, capacity=gamma + 2, role="calibration")
    rows.prefill()
    rows.feed(ids[-1:])
    rows.settle([1] * n_rows)
    return rows


@torch.inference_mode()
def calibrate(target: LVLM, draft: LVLM, **options) -> Calibration:
    """One pair's calibration (`calibrate_drafts` with one draft)."""
    return calibrate_drafts(target, [draft], **options)[0]


@torch.inference_mode()
def calibrate_drafts(
    target: LVLM, drafts: Sequence[LVLM], *, gammas: Sequence[int] = (DecodeConfig.gamma,), repeats: int = 10,
    rounds: int = 5, image: Image.Image | None = None, engine: str | None = None,
    verify_tokens: Sequence[int] = (),
    draft_rows: Sequence[int] = (), rows_per_draft: Sequence[Sequence[int]] | None = None,
    progress: Callable[[str], None] | None = None,
    contexts: Sequence[int] = (), batches: Sequence[int] = (), draft_names: Sequence[str] | None = None,
) -> list[Calibration]:
    """Measure Tp, Tp(n) for n = gamma + 1 of every gamma and every other of `verify_tokens`
    (a tree's nodes + 1: the verify-latency curve), and for each draft Tq with 1..4 rows and
    every other of `draft_rows` (a tree's draft batch; `rows_per_draft`: each draft's own, where
    they differ: a head drafting M alone never steps 48 rows) on an image prompt, in `rounds` rounds,
    each the median of `repeats` steps after warm-up, with the steps of `engine` (None: the
    device's default, as decoding picks it); and one step of each after text prompts of
    `contexts` tokens (those that fit). The target is measured once per round for all its
    drafts, each draft right after it, so every pair's ratios come from steps timed seconds
    apart. Times are medians over rounds; ratios are the medians of each round's ratios. For
    each of `batches` (requests decoded as one batch) the same target steps with that many
    rows and the same draft steps with that many times the rows are timed in every round.
    `progress(line)` says what was just timed, after the target's steps and after each draft's
    in every round (drafts named by `draft_names`, else their own), so a long calibration is
    never silent for long."""
    load_before = machine_load()
    engine = engine or default_engine(target, *drafts)
    image = image or Image.new("RGB", (336, 336), (120, 80, 200))
    sample = Sample("calibration", "none", 0, "first", PROMPT, (image,))
    gamma = max(gammas)
    sizes = sorted({g + 1 for g in gammas} | set(verify_tokens))
    counts = [sorted(set(range(1, MAX_ROWS + 1)) | set(rows))
              for rows in rows_per_draft or [draft_rows] * len(drafts)]
    target_rows = _prefilled(target, sample, 1, engine, max(sizes))
    target_lengths = [n for n in sorted(set(contexts)) if _fits(target, n)]
    target_long = {n: _prefilled_context(target, n, engine) for n in target_lengths}
    draft_batches = [[_prefilled(draft, sample, n, engine, gamma) for n in mine]
                     for draft, mine in zip(drafts, counts)]
    lengths = [[n for n in target_lengths if _fits(draft, n)] for draft in drafts]
    long_prompts = [{n: _prefilled_context(draft, n, engine) for n in mine}
                    for draft, mine in zip(drafts, lengths)]
    batches = sorted(set(batches) - {1})
    target_batched = {b: _prefilled(target, sample, b, engine, max(sizes)) for b in batches}
    drafts_batched = [{b: [_prefilled(draft, sample, b * n, engine, gamma) for n in mine] for b in batches}
                      for draft, mine in zip(drafts, counts)]
    token, verify, at_length, batched = [], [], [], []
    measured = [([], []) for _ in drafts]  # per draft: its step per batch, its step per context, each round
    batched_drafts = [[] for _ in drafts]  # per draft, each round: {batch: its step per row count}
    say = progress or (lambda line: None)
    names = draft_names or [d.name for d in drafts]
    for done in range(1, rounds + 1):
        token.append(_step_seconds(target, target_rows, 1, repeats))
        verify.append([_step_seconds(target, target_rows, n, repeats) for n in sizes])
        at_length.append({n: _step_seconds(target, rows, 1, repeats) for n, rows in target_long.items()})
        say(f"round {done}/{rounds}: target step {token[-1] * 1e3:.1f} ms, verify of {len(sizes)} sizes "
            f"and {len(target_long)} prompt lengths timed")
        for draft, name, mine, long, (steps, context_steps) in zip(drafts, names, draft_batches, long_prompts,
                                                                   measured):
            steps.append([_step_seconds(draft, rows, 1, repeats) for rows in mine])
            context_steps.append({n: _step_seconds(draft, rows, 1, repeats) for n, rows in long.items()})
            say(f"round {done}/{rounds}: draft {name} Tq/Tp {steps[-1][0] / token[-1]:.3f} "
                f"({len(mine)} row counts, {len(long)} prompt lengths)")
        batched.append({b: [_step_seconds(target, rows, n, repeats) for n in (1, *sizes)]
                        for b, rows in target_batched.items()})
        for draft, mine, steps in zip(drafts, drafts_batched, batched_drafts):
            steps.append({b: [_step_seconds(draft, rows, 1, repeats) for rows in each]
                          for b, each in mine.items()})
        if batches:
            say(f"round {done}/{rounds}: target and drafts at batch {', '.join(map(str, batches))} timed")
    curve = [[v[i] / t for v, t in zip(verify, token)] for i in range(len(sizes))]
    at_gamma = sizes.index(gamma + 1)
    shared = dict(
        target=target.name, device=str(target.device), dtype=str(target.dtype).removeprefix("torch."),
        gamma=gamma,
        target_token_s=median(token), target_verify_s=median(v[at_gamma] for v in verify), repeats=repeats,
        engine=engine, rounds=rounds, ratio_verify_rounds=curve[at_gamma],
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        device_name=device_name(target.device),
        verify_tokens=sizes, verify_s=[median(v[i] for v in verify) for i in range(len(sizes))],
        verify_ratios=[median(r) for r in curve], verify_ratio_rounds=curve,
        load_before=load_before, load_after=machine_load(), cpu_cores=cpu_cores(), batch_sizes=batches,
        batch_target_token_s=[median(r[b][0] for r in batched) for b in batches],
        batch_verify_ratios=[[median(r[b][1 + i] / r[b][0] for r in batched) for i in range(len(sizes))]
                             for b in batches],
    )
    results = []
    for draft, rows, mine, (steps, context_steps), steps_batched in zip(drafts, counts, lengths, measured,
                                                                        batched_drafts):
        rows_ratio = [[d[m] / t for d, t in zip(steps, token)] for m in range(len(rows))]
        results.append(Calibration(
            draft=draft.name, draft_token_s=median(d[0] for d in steps),
            draft_rows_token_s=[median(d[m] for d in steps) for m in range(len(rows))], draft_row_counts=rows,
            ratio_draft_target_rounds=rows_ratio[0], draft_rows_ratio=[median(r) for r in rows_ratio],
            draft_rows_ratio_rounds=rows_ratio, context_tokens=mine,
            context_target_s=[median(r[n] for r in at_length) for n in mine],
            context_draft_s=[median(r[n] for r in context_steps) for n in mine],
            batch_draft_ratios=[[median(d[b][m] / t[b][0] for d, t in zip(steps_batched, batched))
                                 for m in range(len(rows))] for b in batches],
            **shared,
        ))
    return results
