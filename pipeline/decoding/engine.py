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
from typing import Callable, Sequence

import torch

from pipeline.decoding.head_rows import HeadDynamicRows, HeadStaticRows
from pipeline.decoding.inputs import Prompt, check_fits
from pipeline.decoding.lookup_rows import LookupRows
from pipeline.decoding.medusa_rows import MedusaRows
from pipeline.decoding.mixed_rows import MixedRows
from pipeline.decoding.rows import DynamicCacheRows
from pipeline.decoding.rows_protocol import Rows
from pipeline.decoding.state_rows import StateRows
from pipeline.decoding.static_rows import StaticCacheRows
from pipeline.decoding.timing import PhaseTimer
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.methods import method_embeddings, needs_captions
from pipeline.models.base import LVLM, ModelInputError, StepLog
from pipeline.models.lookup_names import LOOKUP_LETTER

ENGINES = ("static", "eager")
CPU_ENGINE = "static"  # measured on the 2-core CPU: see docs/engine.md
COMPILE_ENV = "TABED_COMPILE"  # auto (GPU only) | 1 (always) | 0 (never)
# a state-space draft's rows beside compiled target steps: why that row is not compiled throughout
STATE_SPACE_UNCOMPILED = ("state-space draft steps run uncompiled by design (a state per row, "
                          "restored after each block; no static cache to compile over)")
SPREAD_UNCOMPILED = ("a model spread over several GPUs runs its steps uncompiled "
                     "(a CUDA graph holds one device's kernels)")
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
    prompts: Sequence[Prompt],
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
    whole: bool = False,
    hidden: tuple[int, ...] = (),
    target_states: list[torch.Tensor] | None = None,
) -> tuple[Rows, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
    """A row per prompt and method (request-major) holding `prompt[:-1]` in the cache (the last
    token is fed later), and the prefill's logits after each row's prompt `[rows, 1, V]`.

    `whole`: the whole prompt (AR reads its first token from those logits); `capacity`:
    continuation tokens the rows must hold (static engine); `span`: the most tokens fed in one
    block (a state-space draft keeps that many saved states; None: `capacity`); `compiled`
    overrides whether decode steps compile (None: `compiles(device)`); `step_log` collects how
    steps ran; `timer` times image features and captions as `<role>_vision`; `hidden`: the
    prefill also returns those hidden states at every prompt slot (what a head draft reads);
    `target_states`: for a head draft, each request's target states at its prompt's positions."""
    cut = None if whole else -1
    for prompt in prompts:
        check_fits(model, len(prompt.ids) + capacity, prompt)  # before anything is embedded or allocated
    embeds, positions, extras = [], [], []
    with timer.phase(f"{role}_vision") if timer else nullcontext():
        for prompt in prompts:
            captions = None
            if needs_captions(methods):
                if captioner is None:
                    raise ModelInputError(f"caption drafting in {methods!r} needs a captioner")
                captions = [captioner.caption(image) for image in prompt.images]
            spliced = [method_embeddings(model, m, prompt.ids, prompt.images, captions) for m in methods]
            mine = [e[:cut] for e in spliced]
            # with the image features spliced in
            check_fits(model, max(len(e) for e in mine) + 1 + capacity, prompt)
            positions += [_cut(model.prompt_positions(e), cut) for e in spliced]
            extras += [model.prompt_extras(e) for e in spliced]  # noted on the rows as spliced, whole
            embeds += mine
    states = None if target_states is None else [s for s in target_states for _ in methods]
    rows = new_rows(model, embeds, engine=engine, capacity=capacity, role=role, compiled=compiled,
                    step_log=step_log, span=span, per_request=len(methods), positions=positions,
                    extras=extras, target_states=states, methods=methods)
    return rows, rows.prefill(hidden) if hidden else rows.prefill()


def _cut(positions: torch.Tensor | None, cut: int | None) -> torch.Tensor | None:
    return None if positions is None else positions[:, :cut]


def new_rows(
    model: LVLM, prompts: list[torch.Tensor], *, engine: str, capacity: int, role: str,
    compiled: bool | None = None, step_log: StepLog | None = None, span: int | None = None,
    per_request: int = 1, positions: list[torch.Tensor | None] | None = None, extras: list | None = None,
    target_states: list[torch.Tensor] | None = None, methods: str | None = None,
) -> Rows:
    """Rows of prompt embeddings `[L_i, hidden]` (not prefilled), `per_request` rows per request,
    of the kind the model drafts with (`model.drafter`, a key of `DRAFTERS`) on `engine`;
    `positions` and `extras`: each prompt's `model.prompt_positions` and `model.prompt_extras`;
    `target_states`: each row's target states at its prompt positions (a head's rows read them);
    `methods`: each request's rows' drafting methods, in order (an ensemble across drafters
    splits by them)."""
    check_engine(engine)
    if model.drafter not in DRAFTERS:
        raise ValueError(f"{model.name} drafts with {model.drafter!r} rows, which no drafter builds; "
                         f"known: {sorted(DRAFTERS)}")
    compiled = compiles(model.device) if compiled is None else compiled
    build = DRAFTERS[model.drafter]
    return build(model, prompts, engine=engine, capacity=capacity, role=role, compiled=compiled,
                 step_log=step_log, span=span, per_request=per_request, positions=positions, extras=extras,
                 target_states=target_states, methods=methods)


def kv_rows(model: LVLM, prompts: list[torch.Tensor], *, engine: str, capacity: int, role: str,
            compiled: bool, step_log: StepLog | None, per_request: int, positions: list | None,
            extras: list | None, kinds: tuple[type, type] = (DynamicCacheRows, StaticCacheRows),
            given: dict | None = None, **unused: object) -> Rows:
    """A KV cache per row: the engine's kind (`kinds`: its eager and static classes, built with
    `given` besides)."""
    eager, static = kinds
    given = given or {}
    if engine == "eager":
        return eager(model, prompts, per_request=per_request, step_log=step_log, positions=positions,
                     extras=extras, **given)
    spread = compiled and model.gpus > 1  # a CUDA graph captures the kernels of one device
    rows = static(model, prompts, capacity=capacity, compiled=compiled and not spread, role=role,
                  per_request=per_request, step_log=step_log, positions=positions, extras=extras, **given)
    if spread:
        rows.step_log.fallbacks.add(SPREAD_UNCOMPILED)
    return rows


def state_rows(model: LVLM, prompts: list[torch.Tensor], *, engine: str, capacity: int, compiled: bool,
               step_log: StepLog | None, span: int | None, per_request: int, **unused: object) -> Rows:
    """A state per row, on any engine; never compiled (a row beside compiled steps says why)."""
    rows = StateRows(model, prompts, span=capacity if span is None else span, per_request=per_request,
                     step_log=step_log)
    if engine == "static" and compiled:
        rows.step_log.fallbacks.add(STATE_SPACE_UNCOMPILED)  # a row not compiled throughout says why
    return rows


def head_rows(model: LVLM, prompts: list[torch.Tensor], *, target_states: list[torch.Tensor] | None,
              **engine: object) -> Rows:
    """A head's KV rows over its own layer, reading the target's states (`pipeline.decoding.head_rows`)."""
    if target_states is None:
        raise ValueError(f"{model.name} is a head: its rows need the target's states at the prompt")
    return kv_rows(model, prompts, kinds=(HeadDynamicRows, HeadStaticRows),
                   given={"target_states": target_states}, **engine)


def head_prompt_states(head: LVLM, prompts: list[torch.Tensor], engine: str) -> list[torch.Tensor]:
    """The head's target's states at each prompt's positions (one target prefill): what a head's
    rows read, where no decode has prefilled the target (calibration)."""
    rows = new_rows(head.target, prompts, engine=engine, capacity=1, role="head_states", compiled=False)
    _, states = rows.prefill(head.target_layers)
    return rows.prompt_states(states)


def medusa_rows(model: LVLM, prompts: list[torch.Tensor], **engine: object) -> Rows:
    """Medusa's heads keep nothing: the same rows on either engine (`pipeline.decoding.medusa_rows`)."""
    return MedusaRows(model, prompts, **engine)


def lookup_rows(model: LVLM, prompts: list[torch.Tensor], **engine: object) -> Rows:
    """A lookup per row over its token context, on either engine (`pipeline.decoding.lookup_rows`)."""
    return LookupRows(model, prompts, **engine)


def mixed_rows(model: LVLM, prompts: list[torch.Tensor], *, methods: str | None = None, per_request: int = 1,
               positions: list | None = None, extras: list | None = None, step_log: StepLog | None = None,
               target_states: list[torch.Tensor] | None = None, **engine: object) -> Rows:
    """An ensemble across drafters (`pipeline.models.mixed_draft`): the rows of methods L are the
    lookup's, the others the draft model's (or head's) own kind (`pipeline.decoding.mixed_rows`).
    Without `methods` (calibration's rows), every row is the model's."""
    looks = [methods is not None and methods[i % per_request] == LOOKUP_LETTER for i in range(len(prompts))]
    lookup, rest = [i for i, row in enumerate(looks) if row], [i for i, row in enumerate(looks) if not row]
    pick = lambda values, index: None if values is None else [values[i] for i in index]
    looked = len(lookup) * per_request // len(prompts)
    if rest:
        own = new_rows(model.model_draft, pick(prompts, rest), per_request=per_request - looked,
                       positions=pick(positions, rest), extras=pick(extras, rest), step_log=step_log,
                       target_states=pick(target_states, rest), **engine)
        if not lookup:
            return own
        step_log = own.step_log
    rows = LookupRows(model.lookup, pick(prompts, lookup), per_request=looked, step_log=step_log)
    return MixedRows([(own, rest), (rows, lookup)], per_request) if rest else rows


# what drafts with a model (`LVLM.drafter`): a new kind of drafter is a rows class, a builder here
# and a model adapter that names it
DRAFTERS: dict[str, Callable[..., Rows]] = {"kv": kv_rows, "state": state_rows, "head": head_rows,
                                            "medusa": medusa_rows, "lookup": lookup_rows, "mixed": mixed_rows}
