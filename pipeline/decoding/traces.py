"""Trace collection for exact replay (`pipeline.decoding.replay`): the target's greedy output y
and its distributions along y, shared by every draft paired with it, then each draft's methods'
distributions along y in one teacher-forced forward, batched as the loop batches them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.data.sample import Sample
from pipeline.decoding.acceptance import probabilities
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import default_engine, prefilled_rows
from pipeline.decoding.loop import autoregressive_decode
from pipeline.decoding.inputs import tokenize
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.lookup_replay import LookupTrace
from pipeline.decoding.replay import Traces
from pipeline.models.lookup_names import LOOKUP_LETTER
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.methods import method_embeddings
from pipeline.models.base import LVLM


class ForwardCounter:
    """An LVLM stand-in that counts forward passes (`logits` calls) and passes all else through.

    Wrap a target with it to compare how many target forwards live runs and trace collection
    cost; a prefill counts as one forward.
    """

    def __init__(self, model: LVLM) -> None:
        self.model = model
        self.forwards = 0

    def logits(self, **kwargs: Any) -> torch.Tensor:
        self.forwards += 1
        return self.model.logits(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def _teacher_forced_logits(
    model: LVLM, sample: Sample, methods: str, captioner: Captioner | None, y: list[int], engine: str
) -> torch.Tensor:
    """Logits `[rows, n, V]` before each token of y, one row per method, in ONE forward after
    the same prefill the live engine runs (same rows, padding and prompt cache). This forward's
    shape is new for every sample, so it never compiles."""
    prompt = tokenize(model, sample)
    # never rolled back: a state-space draft saves no states past the last one
    rows, _ = prefilled_rows(model, [prompt], methods, captioner, engine=engine, capacity=len(y),
                             role="trace", compiled=False, span=1)
    sequence = [prompt.ids[-1]] + y[:-1]
    return rows.feed(sequence, keep=len(sequence))


def _drafted_probs(draft: LVLM, sample: Sample, letters: str, captioner: Captioner | None, y: list[int],
                   engine: str) -> torch.Tensor:
    """`[n, len(letters), V]`: each method's teacher-forced distributions along y; in an ensemble
    across drafters the model's methods from its rows and a ranking lookup's L from its own."""
    mixed = draft.drafter == "mixed"
    own = letters.replace(LOOKUP_LETTER, "") if mixed else letters
    parts = {}
    if own:
        model = draft.model_draft if mixed else draft
        logits = _teacher_forced_logits(model, sample, own, captioner, y, engine)
        parts.update(zip(own, probabilities(logits, 0.0).cpu()))
    if mixed and LOOKUP_LETTER in letters:
        logits = _teacher_forced_logits(draft.lookup, sample, "M", None, y, engine)
        parts[LOOKUP_LETTER] = probabilities(logits, 0.0).cpu()[0]
    return torch.stack([parts[letter] for letter in letters], 1)


@dataclass
class TargetTrace:
    """The target's half of a sample's traces, shared by every draft paired with the target:
    y (its greedy output) and p along y."""

    output_ids: list[int]
    target_probs: torch.Tensor
    max_new_tokens: int
    engine: str
    target_forwards: int
    time_s: float
    baseline: SampleRecord


@torch.inference_mode()
def trace_target(
    target: LVLM, sample: Sample, *, max_new_tokens: int, engine: str = "eager",
    baseline: SampleRecord | None = None,
) -> TargetTrace:
    """y from `autoregressive_decode` (the target alone, greedy), unless `baseline` is such a
    decode already made (a live AR row of the same budget and engine), then one
    teacher-forced target forward over prompt + y.

    Target forwards: len(y) for y when decoded here (the prefill gives the first token), 2 for
    the teacher-forced pass.
    """
    start = time.perf_counter()
    counted = ForwardCounter(target)
    if baseline is None:
        [baseline] = autoregressive_decode(counted, [sample], max_new_tokens=max_new_tokens, engine=engine)
    y = baseline.output_ids
    target_logits = _teacher_forced_logits(counted, sample, "M", None, y, engine)[0]
    return TargetTrace(y, probabilities(target_logits, 0.0).cpu(), max_new_tokens, engine, counted.forwards,
                       time.perf_counter() - start, baseline)


@torch.inference_mode()
def collect_traces(
    target: LVLM,
    draft: LVLM,
    sample: Sample,
    methods: str = "MTCP",
    captioner: Captioner | None = None,
    *,
    max_new_tokens: int,
    engine: str | None = None,
    target_trace: TargetTrace | None = None,
) -> Traces:
    """Traces of one sample: the target's (`trace_target`, or `target_trace` when another
    draft of this target has made them for the same budget and engine), then one
    teacher-forced draft forward with all `methods` as rows of one batch, exactly as the live
    engine batches them."""
    DecodeConfig(methods=methods, max_new_tokens=max_new_tokens).validate()
    engine = engine or default_engine(target, draft)
    start = time.perf_counter()
    if target_trace is None:
        target_trace = trace_target(target, sample, max_new_tokens=max_new_tokens, engine=engine)
    elif (target_trace.max_new_tokens, target_trace.engine) != (max_new_tokens, engine):
        raise ValueError(
            f"the target trace of {sample.sample_id} was made for {target_trace.max_new_tokens} tokens "
            "on the "
            f"{target_trace.engine} engine, not {max_new_tokens} on {engine}"
        )
    y = target_trace.output_ids
    lookup, drafted = None, methods
    looks = {"lookup": draft, "mixed": getattr(draft, "lookup", None)}.get(draft.drafter)
    if looks is not None and not looks.ranks:  # a planning lookup: its context serves replay
        prompt = tokenize(looks, sample)
        lookup = LookupTrace(method_embeddings(looks, "M", prompt.ids, prompt.images)[:, 0].tolist(),
                             looks.new_lookup)
        drafted = "" if draft.drafter == "lookup" else methods.replace(LOOKUP_LETTER, "")
    draft_probs = torch.zeros(len(y), len(methods), 0)
    if drafted:
        drafted_probs = _drafted_probs(draft, sample, drafted, captioner, y, engine)  # [n, m, V]
        # a planning lookup's L in an ensemble: a placeholder, made per block by replay (`LookupColumn`)
        draft_probs = torch.zeros(len(y), len(methods), drafted_probs.shape[-1])
        draft_probs[:, [i for i, m in enumerate(methods) if m in drafted]] = drafted_probs
    return Traces(
        sample_id=sample.sample_id,
        methods=methods,
        output_ids=y,
        target_probs=target_trace.target_probs,
        draft_probs=draft_probs,
        max_new_tokens=max_new_tokens,
        eos_token_ids=frozenset(target.eos_token_ids),
        tokenizer=target.tokenizer,
        engine=engine,
        target_forwards=target_trace.target_forwards,
        time_collect_s=target_trace.time_s + time.perf_counter() - start,
        baseline=target_trace.baseline,
        lookup=lookup,
    )
