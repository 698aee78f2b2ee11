"""The live speculative decoding loop (docs/algorithm.md §1, §3) and its autoregressive baseline.

One block: choose ensemble weights w* from the history, draft `gamma` tokens with every
drafting method as one batch, mix the methods' next-token distributions with w*, let the
target score all proposals in ONE forward, accept, roll both caches back. The sequence shared
by every row starts with the prompt's last token, so both models prefill `prompt[:-1]` once
and then only ever feed what is not cached yet — no special first block.

Inside a block nothing waits for the device: proposals, mixing, the acceptance test and the
weights stay tensors, and ONE transfer at the end brings back the accepted count, the
proposals, the target's token and the weights. What the block then keeps, records and adds to
the history is `pipeline.decoding.block.settle_block`, the same rule trace replay uses.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from pipeline.data.sample import Sample
from pipeline.decoding.block import BlockOutcome, recorded_weights, settle_block
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import PhaseTimer, default_engine, prefilled_rows, tokenize
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.verify import sample_token, verify_greedy, verify_sampling
from pipeline.decoding.rows import DynamicCacheRows
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.scoring import mix, mixing_weights
from pipeline.models.base import LVLM, StepLog


def sample_generator(config: DecodeConfig, sample_id: str) -> torch.Generator:
    """A CPU generator seeded by (seed, sample): reproducible, independent of device and order."""
    return torch.Generator().manual_seed(zlib.crc32(f"{config.seed}:{sample_id}".encode()))


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits / (temperature or 1.0), dim=-1)


@dataclass
class Draft:
    """What one block's drafting produced, all on the device: proposals `[g]`, each method's
    distributions `[g, m, V]` (only when the history needs them) and the mixtures `[g, V]`."""

    proposals: torch.Tensor
    method_probs: torch.Tensor | None
    mixed_probs: torch.Tensor


def draft_block(
    rows: DynamicCacheRows, pending: torch.Tensor, weights: torch.Tensor, config: DecodeConfig,
    uniforms: torch.Tensor | None, keep_methods: bool, timer: PhaseTimer,
) -> Draft:
    """`gamma` proposals from the mixture of all rows; `pending` are the shared tokens the rows
    have not seen yet (1, or 2 after a fully accepted block); `weights` in the rows'
    distributions' dtype (`mixing_weights`)."""
    logits = rows.feed(pending)[:, -1]
    proposals, method_probs, mixed_probs = [], [], []
    for i in range(config.gamma):
        q = probabilities(logits, config.temperature)  # [m, V]
        with timer.phase("tabed"):
            mixed = mix(q, weights)
        token = mixed.argmax(-1, keepdim=True) if config.greedy else sample_token(mixed, uniforms[i]).view(1)
        proposals.append(token)
        method_probs.append(q)
        mixed_probs.append(mixed)
        if i < config.gamma - 1:
            logits = rows.feed(token)[:, -1]
    return Draft(torch.cat(proposals), torch.stack(method_probs) if keep_methods else None, torch.stack(mixed_probs))


class SpeculativeDecoder:
    """The state of one sample's SD run between blocks: both row sets, the tokens each has not
    seen yet, the weight policy's state and the output so far."""

    def __init__(self, target_rows: DynamicCacheRows, draft_rows: DynamicCacheRows, first_token: int, config: DecodeConfig,
                 generator: torch.Generator, eos: set[int], timer: PhaseTimer) -> None:
        self.target_rows, self.draft_rows = target_rows, draft_rows
        self.config, self.generator, self.eos, self.timer = config, generator, eos, timer
        self.device = target_rows.model.device
        self.weights = config.policy.start(len(config.methods), self.device)
        self.uniforms = self._draw_uniforms()
        self.blocks = 0
        self.target_pending = self.draft_pending = torch.tensor([first_token], device=self.device)
        self.output: list[int] = []

    def block(self) -> tuple[BlockOutcome, list[float]]:
        """Draft, verify and settle one block; exactly one device-to-host transfer."""
        config, gamma, timer = self.config, self.config.gamma, self.timer
        with timer.phase("draft"):
            with timer.phase("tabed"):
                weights = self.weights.choose()
                mixing = mixing_weights(weights) if len(config.methods) > 1 else weights
            uniforms = None if self.uniforms is None else self.uniforms[self.blocks]
            self.blocks += 1
            draft = draft_block(self.draft_rows, self.draft_pending, mixing, config, uniforms, self.weights.learns, timer)
        with timer.phase("verify"):
            logits = self.target_rows.feed(torch.cat([self.target_pending, draft.proposals]), keep=gamma + 1)[0]
            p = probabilities(logits, config.temperature) if self.weights.learns or not config.greedy else None
            if config.greedy:
                accepted, next_token = verify_greedy(draft.proposals, logits)
            else:
                accepted, next_token = verify_sampling(draft.proposals, p, draft.mixed_probs, uniforms[gamma:])
            summary = torch.cat([accepted.view(1), next_token.view(1), draft.proposals]).double()
            values = torch.cat([summary, weights]).tolist()  # the block's one transfer
            a, token, proposals = int(values[0]), int(values[1]), [int(v) for v in values[2 : 2 + gamma]]
            outcome = settle_block(proposals[:a], token, gamma=gamma, produced=len(self.output),
                                   max_new_tokens=config.max_new_tokens, eos=self.eos)
            self.output.extend(outcome.tokens)
            if outcome.history and self.weights.learns:
                with timer.phase("tabed"):
                    self.weights.update(draft.method_probs[: outcome.history], p[: outcome.history])
            if not outcome.stop:
                self._roll_back(a, torch.cat([draft.proposals[:a], next_token.view(1)]))
        return outcome, recorded_weights(values[2 + gamma:])

    def _draw_uniforms(self) -> torch.Tensor | None:
        """Sampling's uniforms for every block the sample can take (each yields a token), in
        one copy to the device: per block, g proposals, g acceptance tests, 1 emitted token.
        The same values, in the same order, as drawing them block by block."""
        if self.config.greedy:
            return None
        gamma, blocks = self.config.gamma, self.config.max_new_tokens
        return torch.rand(blocks, 2 * gamma + 1, generator=self.generator, dtype=torch.float64).to(self.device)

    def _roll_back(self, accepted: int, block_tokens: torch.Tensor) -> None:
        """Keep the accepted proposals in both caches; queue what each has not seen.
        `block_tokens`: the accepted proposals and the target's token, on the device."""
        gamma, before = self.config.gamma, len(self.output) - accepted  # shared tokens fed before the block
        self.target_rows.keep_shared(before + accepted)
        self.draft_rows.keep_shared(before + min(accepted, gamma - 1))
        self.target_pending = block_tokens[accepted : accepted + 1]
        self.draft_pending = block_tokens[min(accepted, gamma - 1) : accepted + 1]


@torch.inference_mode()
def speculative_decode(
    target: LVLM,
    draft: LVLM,
    sample: Sample,
    config: DecodeConfig,
    captioner: Captioner | None = None,
    *,
    engine: str | None = None,
) -> SampleRecord:
    """Decode one sample with SD; greedy output is token-identical to the target's own.
    `engine`: `static` or `eager` (None: the device's default)."""
    config.validate()
    engine = engine or default_engine(target, draft)
    timer = PhaseTimer(target.device)
    record = SampleRecord(sample_id=sample.sample_id, mode="live", engine=engine)
    capacity, steps = config.max_new_tokens + config.gamma + 1, StepLog()
    with timer.phase("prefill"):
        target_prompt, draft_prompt = tokenize(target, sample), tokenize(draft, sample)
        target_rows = prefilled_rows(target, target_prompt, "M", None, engine=engine, capacity=capacity, role="target",
                                     step_log=steps)
        draft_rows = prefilled_rows(draft, draft_prompt, config.methods, captioner, engine=engine, capacity=capacity,
                                    role="draft", step_log=steps)
    decoder = SpeculativeDecoder(target_rows, draft_rows, target_prompt.ids[-1], config,
                                 sample_generator(config, sample.sample_id), target.eos_token_ids, timer)
    while True:
        outcome, weights = decoder.block()
        record.accepted_per_block.append(outcome.accepted)
        record.weights_per_block.append(weights)
        if outcome.stop:
            break
    return _finish(record, decoder.output, target, timer, steps)


@torch.inference_mode()
def autoregressive_decode(
    target: LVLM, sample: Sample, *, max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
    engine: str | None = None,
) -> SampleRecord:
    """The baseline: the target alone, one token per forward, through the same rows and cache
    code as SD so that timings compare like with like. Every token is a block of tau 1."""
    config = DecodeConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    config.validate()
    engine = engine or default_engine(target)
    timer = PhaseTimer(target.device)
    record = SampleRecord(sample_id=sample.sample_id, mode="ar", engine=engine)
    generator, steps = sample_generator(config, sample.sample_id), StepLog()
    with timer.phase("prefill"):
        prompt = tokenize(target, sample)
        rows = prefilled_rows(target, prompt, "M", None, engine=engine, capacity=max_new_tokens + 1, role="target",
                              step_log=steps)
    pending = torch.tensor([prompt.ids[-1]], device=target.device)
    output: list[int] = []
    while True:
        with timer.phase("verify"):
            logits = rows.feed(pending)[0, -1]
            if config.greedy:
                token = logits.argmax(-1)
            else:
                token = sample_token(probabilities(logits, temperature), torch.rand((), generator=generator, dtype=torch.float64))
            outcome = settle_block([], int(token), gamma=1, produced=len(output), max_new_tokens=max_new_tokens,
                                   eos=target.eos_token_ids)
            output.extend(outcome.tokens)
            record.accepted_per_block.append(0)
            pending = token.view(1)
        if outcome.stop:
            break
    return _finish(record, output, target, timer, steps)


def _finish(record: SampleRecord, output: list[int], target: LVLM, timer: PhaseTimer, steps: StepLog) -> SampleRecord:
    record.steps = steps.summary
    record.fallback = "; ".join(sorted(steps.fallbacks)) or None
    record.output_ids = output
    record.output_text = target.tokenizer.decode(output, skip_special_tokens=True)
    seconds = timer.totals()
    record.time_prefill_s = seconds["prefill"]
    record.time_draft_s = seconds["draft"]
    record.time_verify_s = seconds["verify"]
    record.time_tabed_s = seconds["tabed"]
    record.time_total_s = seconds["prefill"] + seconds["draft"] + seconds["verify"]
    return record
