"""The live speculative decoding loop (docs/algorithm.md §1, §3) and its autoregressive baseline.

One block reads top to bottom in `SpeculativeDecoder.block`: choose the ensemble weights w*
from the history, let the draft propose with every drafting method as one batch
(`pipeline.decoding.draft`: a chain or a token tree), let the target score the pending token
and all proposals in ONE forward and accept (`pipeline.decoding.target`), read the block back
in one transfer (`BlockResult`), settle it (`acceptance.settle_block`: what is kept, recorded
and learned, the same rule trace replay uses) and roll both caches back to the accepted path.
The sequence every row shares starts with the prompt's last token, so both models prefill
`prompt[:-1]` once and then only feed what is not cached yet: there is no special first block.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import torch

from pipeline.data.sample import Sample
from pipeline.decoding.acceptance import probabilities, recorded_weights, sample_token, settle_block
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import ChainProposer
from pipeline.decoding.draft_kinds import proposer_class
from pipeline.decoding.engine import default_engine, prefilled_rows
from pipeline.decoding.prompts import tokenize
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.rows import Rows
from pipeline.decoding.target import Checked, check, keep_accepted
from pipeline.decoding.timing import PhaseTimer
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.scoring import mixing_weights
from pipeline.models.base import LVLM, StepLog


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
    if config.is_ar:
        raise ValueError("the AR baseline has no draft: decode it with autoregressive_decode")
    engine = engine or default_engine(target, draft)
    timer, steps = PhaseTimer(target.device), StepLog()
    record = SampleRecord(sample_id=sample.sample_id, mode="live", engine=engine)
    target_capacity, draft_capacity = capacities(config)
    with timer.phase("prefill"):
        target_prompt, draft_prompt = tokenize(target, sample), tokenize(draft, sample)
        with timer.phase("target_prefill"):
            target_rows = prefilled_rows(target, target_prompt, "M", None, engine=engine,
                                         capacity=target_capacity, role="target", step_log=steps, timer=timer)
        # a candidate tree's branches: a row each
        copies = config.verify.copies_per_method(len(config.methods))
        with timer.phase("draft_prefill"):
            span = config.verify.draft_capacity(config.gamma) + 2
            draft_rows = prefilled_rows(draft, draft_prompt, config.methods * copies, captioner,
                                        engine=engine, capacity=draft_capacity, role="draft", step_log=steps,
                                        span=span, timer=timer)
    proposer = proposer_class(config.verify)(draft_rows, config)
    decoder = SpeculativeDecoder(target_rows, proposer, target_prompt.ids[-1], config, record,
                                 sample_generator(config, sample.sample_id), target.eos_token_ids, timer)
    stop = False
    while not stop:
        stop = decoder.block()
    return finish_record(record, decoder.output, target, timer, steps)


@dataclass(frozen=True)
class BlockResult:
    """A verified block as the host reads it, from the block's one device-to-host transfer:
    the `accepted` proposals' tokens `proposals`, the target's `next_token` after them, the
    weights w* the block drafted with (as records keep them) and a bandit's shape `arm`."""

    accepted: int
    proposals: list[int]
    next_token: int
    weights: list[float]
    arm: int | None

    @staticmethod
    def read(checked: Checked, weights: torch.Tensor, gamma: int, arm: int | None) -> BlockResult:
        head = torch.cat([checked.accepted.view(1), checked.next_token.view(1)])
        summary = torch.cat([head, checked.path_tokens]).double()
        values = torch.cat([summary, weights]).tolist()  # the one transfer
        accepted = int(values[0])
        proposals = [int(v) for v in values[2 : 2 + accepted]]
        return BlockResult(accepted, proposals, int(values[1]), recorded_weights(values[2 + gamma :]), arm)


class SpeculativeDecoder:
    """One sample's SD run between blocks: the target's rows, the proposer (which holds the
    draft's rows), the tokens each has not seen yet, the weight policy's state, the output so
    far and the record each block adds to."""

    def __init__(self, target_rows: Rows, proposer: ChainProposer, first_token: int, config: DecodeConfig,
                 record: SampleRecord, generator: torch.Generator, eos: set[int], timer: PhaseTimer) -> None:
        self.target_rows, self.proposer, self.record = target_rows, proposer, record
        self.config, self.eos, self.timer = config, eos, timer
        self.device = target_rows.model.device
        self.weights = config.policy.start(len(config.methods), self.device)
        self.uniforms = self._draw_uniforms(generator)
        self.target_pending = self.draft_pending = torch.tensor([first_token], device=self.device)
        self.output: list[int] = []

    def block(self) -> bool:
        """Draft, verify and settle one block with exactly one device-to-host transfer; record
        it. Returns whether generation stopped."""
        config, timer, learns, proposer = self.config, self.timer, self.weights.learns, self.proposer
        gamma, arm = proposer.gamma, getattr(proposer, "arm", None)
        uniforms = None if self.uniforms is None else self.uniforms[self.record.blocks]
        with timer.phase("draft"):
            with timer.phase("tabed_draft"):
                weights = self.weights.choose()
                mixing = mixing_weights(weights) if len(config.methods) > 1 else weights
            proposer.budget = config.max_new_tokens - len(self.output)
            proposal = proposer.propose(self.draft_pending, mixing, uniforms, learns)
        with timer.phase("verify"):
            checks = None if uniforms is None else uniforms[proposer.draws_per_block:]
            checked = check(self.target_rows, self.target_pending, proposal, proposer, config, checks, learns)
            result = BlockResult.read(checked, weights, gamma, arm)
            produced = len(self.output)
            outcome = settle_block(result.proposals, result.next_token, gamma=gamma, produced=produced,
                                   max_new_tokens=config.max_new_tokens, eos=self.eos)
            self._record(result, outcome.accepted, outcome.tokens)
            if outcome.history and learns:
                with timer.phase("tabed"):
                    methods = proposer.history(proposal, checked.path, result.accepted, outcome.history)
                    self.weights.update(methods, checked.path_probs[: outcome.history])
            if not outcome.stop:
                a = result.accepted
                before = len(self.output) - a  # shared tokens fed before the block
                block = torch.cat([checked.path_tokens[:a], checked.next_token.view(1)])
                keep_accepted(self.target_rows, checked, a, before)
                self.target_pending = block[a : a + 1]
                self.draft_pending = proposer.keep(proposal, checked.path, a, before, block)
        return outcome.stop

    def _record(self, result: BlockResult, accepted: int, tokens: list[int]) -> None:
        self.output.extend(tokens)
        self.record.accepted_per_block.append(accepted)
        self.record.weights_per_block.append(result.weights)
        if result.arm is not None:
            self.record.shape_per_block.append(result.arm)

    def _draw_uniforms(self, generator: torch.Generator) -> torch.Tensor | None:
        """Sampling's uniforms for every block the sample can take (each yields a token), in
        one copy to the device: per block, the proposer's draws, then the acceptance tests and
        the emitted token (a chain: g proposals, g tests, 1 token). The same values, in the
        same order, as drawing them block by block."""
        if self.config.greedy:
            return None
        per_block = self.proposer.draws_per_block + self.proposer.checks_per_block
        blocks = self.config.max_new_tokens
        return torch.rand(blocks, per_block, generator=generator, dtype=torch.float64).to(self.device)


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
    with timer.phase("prefill"), timer.phase("target_prefill"):
        prompt = tokenize(target, sample)
        rows = prefilled_rows(target, prompt, "M", None, engine=engine, capacity=max_new_tokens + 1,
                              role="target", step_log=steps, timer=timer)
    pending = torch.tensor([prompt.ids[-1]], device=target.device)
    output: list[int] = []
    while True:
        with timer.phase("verify"):
            logits = rows.feed(pending)[0, -1]
            if config.greedy:
                token = logits.argmax(-1)
            else:
                uniform = torch.rand((), generator=generator, dtype=torch.float64)
                token = sample_token(probabilities(logits, temperature), uniform)
            outcome = settle_block([], int(token), gamma=1, produced=len(output),
                                   max_new_tokens=max_new_tokens, eos=target.eos_token_ids)
            output.extend(outcome.tokens)
            record.accepted_per_block.append(0)
            pending = token.view(1)
        if outcome.stop:
            break
    return finish_record(record, output, target, timer, steps)


def sample_generator(config: DecodeConfig, sample_id: str) -> torch.Generator:
    """A CPU generator seeded by (seed, sample): reproducible, independent of device and order."""
    return torch.Generator().manual_seed(zlib.crc32(f"{config.seed}:{sample_id}".encode()))


def capacities(config: DecodeConfig) -> tuple[int, int]:
    """Continuation slots the target's and the draft's rows may need: the budget plus what one
    block feeds beyond it (a tree's nodes; a dynamic tree's levels in the draft)."""
    nodes = config.verify.tree_nodes(config.gamma, len(config.methods))
    draft_feeds = config.verify.draft_capacity(config.gamma)
    return config.max_new_tokens + nodes + 1, config.max_new_tokens + draft_feeds + 1


def finish_record(record: SampleRecord, output: list[int], target: LVLM, timer: PhaseTimer, steps: StepLog,
                  batch_tokens: int | None = None) -> SampleRecord:
    """Fill the record's output and timings; `batch_tokens`: new tokens of the whole batch it
    decoded in (None: decoded alone). A batched request's `time_request_s` is set as it stops."""
    record.steps = steps.summary
    record.fallback = "; ".join(sorted(steps.fallbacks)) or None
    record.output_ids = output
    record.output_text = target.tokenizer.decode(output, skip_special_tokens=True)
    seconds = timer.totals()
    record.time_prefill_s = seconds["prefill"]
    record.time_draft_s = seconds["draft"]
    record.time_verify_s = seconds["verify"]
    record.time_tabed_draft_s = seconds["tabed_draft"]
    record.time_tabed_s = seconds["tabed_draft"] + seconds["tabed"]
    record.time_vision_s = seconds["target_vision"] + seconds["draft_vision"]
    record.time_target_prefill_s = seconds["target_prefill"]
    record.time_draft_prefill_s = seconds["draft_prefill"]
    record.time_total_s = seconds["prefill"] + seconds["draft"] + seconds["verify"]
    record.time_wall_s = time.perf_counter() - timer.started
    if record.time_request_s is None:
        record.time_request_s = record.time_wall_s
    tokens = len(output) if batch_tokens is None else batch_tokens
    record.batch_tokens_per_s = tokens / record.time_total_s if record.time_total_s > 0 else None
    return record
