"""Exact trace replay: score every greedy drafting configuration from one target pass.

Under greedy decoding SD's output is the target's greedy output y whatever the draft does, and
inside a block starting at position t the i-th proposal only matters if every earlier one
matched y — in which case it was drafted from the true prefix y_<t+i. So the accepted count of
every block, for any method set, policy, window, distance and gamma, is a function of the
target's distributions p_s and each method's distributions q_i,s along y (s = 0..len(y)-1).
TABED's history also only holds such positions. `pipeline.decoding.traces` collects them once
per sample; `replay` runs the block rule of the loop on them (`acceptance.settle_block`, the
policy's state, the proposer's replay rule) without any model, and without the loop itself.

Numerics: replay sees teacher-forced forwards of all traced methods in one batch, live sees
the same positions in other chunk shapes and batches, so in fp32 the two differ by float
rounding (~1e-5 in logits on a CPU). Accepted counts and grid weights then agree except at
near-ties; continuous inverse-error weights agree to ~1e-6 (one unit of the 6 decimals records
keep). `tests/test_replay_tiny.py` measures both; with fp64 forwards everything is identical.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from pipeline.decoding.acceptance import recorded_weights, settle_block
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import proposer_class
from pipeline.decoding.lookup_replay import LookupColumn, LookupTrace
from pipeline.decoding.records import SampleRecord
from pipeline.drafting.scoring import mixing_weights
from pipeline.models.lookup_names import LOOKUP_LETTER


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
    #: a draft-free drafter's context instead of draft distributions (`draft_probs` is empty)
    lookup: LookupTrace | None = field(default=None, repr=False, compare=False)

    @property
    def complete(self) -> bool:
        """Whether y ended with EOS, so any longer budget would decode the same tokens."""
        return bool(self.output_ids) and self.output_ids[-1] in self.eos_token_ids

    def teacher_forced_disagreements(self) -> list[int]:
        """Positions where the teacher-forced target argmax differs from y (numerical
        near-ties between chunk shapes; replay trusts y, the target's own greedy output)."""
        y = torch.tensor(self.output_ids)
        return torch.nonzero(self.target_probs.argmax(-1) != y).flatten().tolist()


def _check_replayable(traces: Traces, config: DecodeConfig) -> None:
    config.validate()
    if not config.greedy:
        raise ValueError(
            f"replay is exact only for greedy decoding, got temperature {config.temperature}: with "
            "sampling the output depends on the draft's proposals, so run the live engine"
        )
    if traces.lookup is not None and LOOKUP_LETTER not in config.methods and not config.verify.is_chain:
        raise ValueError(f"a lookup draft replays as a chain only, not as {config.verify.label}: run it live")
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

    Mirrors `loop.Decoder.block` block by block: weights from the policy state's
    `choose`, then the accepted count (the verify kind's proposer's `replay_accepted`: the
    proposals along y, position by position), then `settle_block`, the loop's own rule, decides
    what is kept, recorded and added to the history. Timings stay 0: replay decodes nothing, walltime comes
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
    # a bandit's rule says which shape each block uses; a lookup's makes its plans; in an ensemble
    # across drafters the lookup's distributions are made per block (`LookupColumn`)
    member = methods.index(LOOKUP_LETTER) if LOOKUP_LETTER in methods and traces.lookup else None
    alone = traces.lookup is not None and member is None
    rule = traces.lookup.rule(config.gamma) if alone else proposer_class(config.verify).replay_rule(config)
    column = LookupColumn(traces.lookup) if member is not None else None
    record = SampleRecord(sample_id=traces.sample_id, mode="replay", engine=traces.engine,
                          prompt_tokens=traces.baseline.prompt_tokens if traces.baseline else None)
    t = 0  # tokens decoded so far = position of the block's first proposal
    while t < n:
        weights, gamma, arm = state.choose(), rule.gamma, rule.arm
        # the block's distributions from its first position on (an ensemble's L made for it), or all
        qb, yb, at = (column.block(q, y, t, gamma, member), y[t:], 0) if column else (q, y, t)
        accepted = rule.accepted(qb, yb, at, gamma, mixing_weights(weights))
        next_token = y[t + accepted] if t + accepted < n else None
        outcome = settle_block(y[t : t + accepted], next_token, gamma=gamma, produced=t,
                               max_new_tokens=config.max_new_tokens, eos=traces.eos_token_ids)
        record.accepted_per_block.append(outcome.accepted)
        record.weights_per_block.append(recorded_weights(weights))
        if arm is not None:
            record.shape_per_block.append(arm)
        if outcome.history and state.learns:
            state.update(qb[at : at + outcome.history], p[t : t + outcome.history])
        t += len(outcome.tokens)
        if outcome.stop:
            break
        rule.observe(accepted)  # as live decoding's proposer does when it keeps the block
    record.output_ids = list(y)
    record.output_text = traces.tokenizer.decode(record.output_ids, skip_special_tokens=True)
    return record
