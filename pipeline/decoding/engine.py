"""Which engine runs the decode loop, and the rows it decodes with, prefilled from a prompt.

Engines (the grid's `engine` axis; outputs are the same, walltimes are not):
- `static`: transformers' `StaticCache`, fixed-shape masks and positions, rollback by moving
  the write position; on a GPU the decode steps (m draft rows x 1-2 tokens, target verify of
  gamma+1 tokens, AR step) are compiled with `torch.compile` and captured as CUDA graphs
  (`pipeline.models.step_graphs`), once per shape and pooled cache, reused across samples.
- `eager`: transformers' `DynamicCache`, grown by concatenation and cropped after each block.

Compiling on a CPU costs over a minute per step shape and did not pay back over a grid here,
so CPU runs are eager forwards (`TABED_COMPILE=1` forces compiling, e.g. to test that path).
"""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch

from pipeline.decoding.prompts import Prompt, check_fits
from pipeline.decoding.rows import DynamicCacheRows, Rows, StaticCacheRows
from pipeline.decoding.state_rows import StateRows
from pipeline.decoding.timing import PhaseTimer
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.methods import method_embeddings, needs_captions
from pipeline.models.base import LVLM, ModelInputError, StepLog

ENGINES = ("static", "eager")
CPU_ENGINE = "static"  # measured on the 2-core CPU: see docs/engine.md
COMPILE_ENV = "TABED_COMPILE"  # auto (GPU only) | 1 (always) | 0 (never)
RECOMPILE_LIMIT = 64  # step shapes per model: rows x tokens x cache sizes


def default_engine(*models: LVLM) -> str:
    """`static` on a GPU; on a CPU whichever measured faster there; `eager` when a model has
    no static-cache support."""
    if not all(model.supports_static_cache for model in models):
        return "eager"
    return "static" if models[0].device.type == "cuda" else CPU_ENGINE


def check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {ENGINES}")


def compiles(device: torch.device) -> bool:
    """Whether static decode steps run compiled on `device`."""
    setting = os.environ.get(COMPILE_ENV, "auto")
    if setting not in ("auto", "0", "1"):
        raise ValueError(f"{COMPILE_ENV} must be auto, 0 or 1, got {setting!r}")
    wanted = device.type == "cuda" if setting == "auto" else setting == "1"
    if wanted:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return wanted


def prefilled_rows(
    model: LVLM,
    prompt: Prompt,
    methods: str,
    captioner: Captioner | None,
    *,
    engine: str,
    capacity: int,
    role: str,
    compiled: bool | None = None,
    step_log: StepLog | None = None,
    span: int | None = None,
    timer: PhaseTimer | None = None,
) -> Rows:
    """One row per method holding `prompt[:-1]` in the cache; the last token is fed later.

    `capacity`: continuation tokens the rows must hold (static engine); `span`: the most tokens
    fed between two roll-backs (a state-space draft keeps that many saved states; None:
    `capacity`); `compiled` overrides whether decode steps compile (None: `compiles(device)`);
    `step_log` collects how steps ran; `timer` times image features and captions as
    `<role>_vision`."""
    check_fits(model, len(prompt.ids) + capacity, prompt)  # before anything is embedded or allocated
    captions = None
    with timer.phase(f"{role}_vision") if timer else nullcontext():
        if needs_captions(methods):
            if captioner is None:
                raise ModelInputError(f"caption drafting in {methods!r} needs a captioner")
            captions = [captioner.caption(image) for image in prompt.images]
        embeds = [method_embeddings(model, m, prompt.ids, prompt.images, captions)[:-1] for m in methods]
    # with the image features spliced in
    check_fits(model, max(len(e) for e in embeds) + 1 + capacity, prompt)
    rows = new_rows(model, embeds, engine=engine, capacity=capacity, role=role, compiled=compiled,
                    step_log=step_log, span=span)
    rows.prefill()
    return rows


def new_rows(
    model: LVLM, prompts: list[torch.Tensor], *, engine: str, capacity: int, role: str,
    compiled: bool | None = None,
    step_log: StepLog | None = None, span: int | None = None,
) -> Rows:
    """Rows of prompt embeddings `[L_i, hidden]` (not prefilled), of the kind the model needs: a
    state-space model's `StateRows` on any engine, else the engine's kind of KV cache."""
    check_engine(engine)
    if getattr(model, "recurrent", False):
        return StateRows(model, prompts, span=capacity if span is None else span, step_log=step_log)
    if engine == "eager":
        return DynamicCacheRows(model, prompts, step_log)
    compiled = compiles(model.device) if compiled is None else compiled
    return StaticCacheRows(model, prompts, capacity=capacity, compiled=compiled, role=role, step_log=step_log)
