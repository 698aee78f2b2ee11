"""Exact trace replay: score every greedy drafting configuration from one target pass.

Under greedy decoding SD's output is the target's greedy output y whatever the draft does, and
inside a block starting at position t the i-th proposal only matters if every earlier one
matched y — in which case it was drafted from the true prefix y_<t+i. So the accepted count of
every block, for any method set, policy, window, distance and gamma, is a function of the
target's distributions p_s and each method's distributions q_i,s along y (s = 0..len(y)-1).
TABED's history also only holds such positions. `collect_traces` computes them once per sample;
`replay` re-runs the block loop of `pipeline.decoding.live` on them with the same policy code,
without any model.

Numerics: replay sees teacher-forced forwards of all traced methods in one batch, live sees
the same positions in other chunk shapes and batches, so in fp32 the two differ by float
rounding (~1e-5 in logits on a CPU). Accepted counts and grid weights then agree except at
near-ties; continuous inverse-error weights agree to ~1e-6 (one unit of the 6 decimals records
keep). `tests/test_replay_tiny.py` measures both; with fp64 forwards everything is identical.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from pipeline.data.sample import Sample
from pipeline.decoding.block import recorded_weights, settle_block
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import default_engine, prefilled_rows, tokenize
from pipeline.decoding.live import autoregressive_decode
from pipeline.decoding.proposer_kinds import proposer_class
from pipeline.decoding.verify import probabilities
from pipeline.decoding.records import SampleRecord
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.scoring import mixing_weights
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


@dataclass
class Traces:
    """Everything replay needs for one sample, on the CPU in fp32 (as the live engine sees it).

    `target_probs[s]` is p(. | prompt, y_<s) `[n, V]`; `draft_probs[s, i]` is method
    `methods[i]`'s q(. | its prompt, y_<s) `[n, M, V]`. Memory: 4 * n * (M + 1) * V bytes,
    e.g. 82 MB for 128 tokens, 4 methods and a 32k vocabulary — keep one sample's traces at a
    time, not a grid's.
    """

    sample_id: str
    methods: str
    output_ids: list[int]
    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    max_new_tokens: int
    eos_token_ids: frozenset[int]
    tokenizer: PreTrainedTokenizerBase = field(repr=False, compare=False)
    engine: str = "eager"  # the engine that decoded y and ran the teacher-forced passes
    target_forwards: int = 0  # greedy decoding (prefill + one per token, unless reused) + teacher-forced pass
    time_collect_s: float = 0.0
    #: the plain greedy decode that produced y: a real AR baseline row, timings included
    baseline: SampleRecord | None = field(default=None, repr=False, compare=False)

    @property
    def complete(self) -> bool:
        """Whether y ended with EOS, so any longer budget would decode the same tokens."""
        return bool(self.output_ids) and self.output_ids[-1] in self.eos_token_ids

    def teacher_forced_disagreements(self) -> list[int]:
        """Positions where the teacher-forced target argmax differs from y (numerical
        near-ties between chunk shapes; replay trusts y, the target's own greedy output)."""
        y = torch.tensor(self.output_ids)
        return torch.nonzero(self.target_probs.argmax(-1) != y).flatten().tolist()


def _teacher_forced_logits(
    model: LVLM, sample: Sample, methods: str, captioner: Captioner | None, y: list[int], engine: str
) -> torch.Tensor:
    """Logits `[rows, n, V]` before each token of y, one row per method, in ONE forward after
    the same prefill the live engine runs (same rows, padding and prompt cache). This forward's
    shape is new for every sample, so it never compiles."""
    prompt = tokenize(model, sample)
    rows = prefilled_rows(model, prompt, methods, captioner, engine=engine, capacity=len(y), role="trace", compiled=False,
                          span=1)  # never rolled back
    sequence = [prompt.ids[-1]] + y[:-1]
    return rows.feed(sequence, keep=len(sequence))


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
    target: LVLM, sample: Sample, *, max_new_tokens: int, engine: str = "eager", baseline: SampleRecord | None = None,
) -> TargetTrace:
    """y from `autoregressive_decode` (the target alone, greedy), unless `baseline` is such a
    decode already made (a live AR row of the same budget and engine), then one
    teacher-forced target forward over prompt + y.

    Target forwards: 1 + len(y) for y when decoded here, 2 for the teacher-forced pass.
    """
    start = time.perf_counter()
    counted = ForwardCounter(target)
    if baseline is None:
        baseline = autoregressive_decode(counted, sample, max_new_tokens=max_new_tokens, engine=engine)
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
            f"the target trace of {sample.sample_id} was made for {target_trace.max_new_tokens} tokens on the "
            f"{target_trace.engine} engine, not {max_new_tokens} on {engine}"
        )
    y = target_trace.output_ids
    draft_logits = _teacher_forced_logits(draft, sample, methods, captioner, y, engine)
    return Traces(
        sample_id=sample.sample_id,
        methods=methods,
        output_ids=y,
        target_probs=target_trace.target_probs,
        draft_probs=probabilities(draft_logits, 0.0).transpose(0, 1).contiguous().cpu(),
        max_new_tokens=max_new_tokens,
        eos_token_ids=frozenset(target.eos_token_ids),
        tokenizer=target.tokenizer,
        engine=engine,
        target_forwards=target_trace.target_forwards,
        time_collect_s=target_trace.time_s + time.perf_counter() - start,
        baseline=target_trace.baseline,
    )


def _check_replayable(traces: Traces, config: DecodeConfig) -> None:
    config.validate()
    if not config.greedy:
        raise ValueError(
            f"replay is exact only for greedy decoding, got temperature {config.temperature}: with "
            "sampling the output depends on the draft's proposals, so run the live engine"
        )
    if not config.verify.replayable:
        raise ValueError(
            f"a {config.verify.label} tree cannot be replayed from traces: its shape depends on draft "
            "distributions off the target's output, so run it live"
        )
    missing = [m for m in config.methods if m not in traces.methods]
    if missing:
        raise ValueError(
            f"config methods {config.methods!r} need {missing}, but the traces of "
            f"{traces.sample_id} hold only {traces.methods!r}: collect traces with a superset"
        )
    if config.max_new_tokens > traces.max_new_tokens and not traces.complete:
        raise ValueError(
            f"config max_new_tokens {config.max_new_tokens} exceeds the {traces.max_new_tokens} "
            f"tokens traced for {traces.sample_id} (which did not end with EOS): collect longer traces"
        )


def replay(traces: Traces, config: DecodeConfig) -> SampleRecord:
    """The record a live greedy run of `config` would produce, computed from traces.

    Mirrors `live.SpeculativeDecoder.block` block by block: weights from the policy state's
    `choose`, then the accepted count (the verify kind's proposer's `replay_accepted`: the
    proposals along y, position by position), then `settle_block` — the live engine's own rule — decides what is kept,
    recorded and added to the history. Timings stay 0: replay decodes nothing, walltime comes
    from live runs.
    """
    _check_replayable(traces, config)
    methods, policy = config.methods, config.policy
    y = traces.output_ids[: config.max_new_tokens]
    n = len(y)
    rows = [traces.methods.index(m) for m in methods]
    q = traces.draft_probs[:n, rows].contiguous()  # [n, m, V] in the config's method order
    p = traces.target_probs
    state = policy.start(len(methods))
    rule = proposer_class(config.verify).replay_rule(config)  # a bandit's: which shape each block uses
    record = SampleRecord(sample_id=traces.sample_id, mode="replay", engine=traces.engine)
    t = 0  # tokens decoded so far = position of the block's first proposal
    while t < n:
        weights, depth, arm = state.choose(), rule.depth, rule.arm
        accepted = rule.accepted(q, y, t, depth, mixing_weights(weights))
        next_token = y[t + accepted] if t + accepted < n else None
        outcome = settle_block(y[t : t + accepted], next_token, gamma=depth, produced=t,
                               max_new_tokens=config.max_new_tokens, eos=traces.eos_token_ids)
        record.accepted_per_block.append(outcome.accepted)
        record.weights_per_block.append(recorded_weights(weights))
        if arm is not None:
            record.shape_per_block.append(arm)
        if outcome.history and state.learns:
            state.update(q[t : t + outcome.history], p[t : t + outcome.history])
        t += len(outcome.tokens)
        if outcome.stop:
            break
        rule.observe(accepted)  # as live decoding's proposer does when it keeps the block
    record.output_ids = list(y)
    record.output_text = traces.tokenizer.decode(record.output_ids, skip_special_tokens=True)
    return record
