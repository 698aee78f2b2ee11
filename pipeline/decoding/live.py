"""The live speculative decoding loop (docs/algorithm.md §1, §3) and its autoregressive baseline.

One block: choose ensemble weights w* from the history, let the proposer draft with every
drafting method as one batch — a chain, or a token tree (`pipeline.decoding.proposers`) —
let the target score the pending token and all proposals in ONE forward and accept
(`pipeline.decoding.verification`), roll both caches back to the accepted path. The sequence
shared by every row starts with the prompt's last token, so both models prefill `prompt[:-1]`
once and then only ever feed what is not cached yet — no special first block.

Inside a block nothing waits for the device: proposals, mixing, the acceptance test and the
weights stay tensors, and ONE transfer at the end brings back the accepted count, the
accepted path's tokens, the target's token and the weights. What the block then keeps,
records and adds to the history is `pipeline.decoding.block.settle_block`, the same rule for
chains and trees, and the one trace replay uses.
"""
from __future__ import annotations

import time
import zlib

import torch

from pipeline.data.sample import Sample
from pipeline.decoding.block import BlockOutcome, recorded_weights, settle_block
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import PhaseTimer, default_engine, prefilled_rows, tokenize
from pipeline.decoding.proposer_kinds import proposer_class
from pipeline.decoding.proposers import ChainProposer
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.rows import Rows
from pipeline.decoding.verification import check, keep_accepted
from pipeline.decoding.verify import probabilities, sample_token
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.scoring import mixing_weights
from pipeline.models.base import LVLM, StepLog

def sample_generator(config: DecodeConfig, sample_id: str) -> torch.Generator:
    """A CPU generator seeded by (seed, sample): reproducible, independent of device and order."""
    return torch.Generator().manual_seed(zlib.crc32(f"{config.seed}:{sample_id}".encode()))


def capacities(config: DecodeConfig) -> tuple[int, int]:
    """Continuation slots the target's and the draft's rows may need: the budget plus what one
    block feeds beyond it (a tree's nodes; a dynamic tree's levels in the draft)."""
    nodes = config.verify.tree_nodes(config.gamma, len(config.methods))
    return config.max_new_tokens + nodes + 1, config.max_new_tokens + config.verify.draft_capacity(config.gamma) + 1


class SpeculativeDecoder:
    """The state of one sample's SD run between blocks: the target's rows, the proposer (which
    holds the draft's rows), the tokens each has not seen yet, the weight policy's state and
    the output so far."""

    def __init__(self, target_rows: Rows, proposer: ChainProposer, first_token: int,
                 config: DecodeConfig, generator: torch.Generator, eos: set[int], timer: PhaseTimer) -> None:
        self.target_rows, self.proposer = target_rows, proposer
        self.config, self.generator, self.eos, self.timer = config, generator, eos, timer
        self.device = target_rows.model.device
        self.weights = config.policy.start(len(config.methods), self.device)
        self.uniforms = self._draw_uniforms()
        self.blocks = 0
        self.target_pending = self.draft_pending = torch.tensor([first_token], device=self.device)
        self.output: list[int] = []

    def block(self) -> tuple[BlockOutcome, list[float], int | None]:
        """Draft, verify and settle one block; exactly one device-to-host transfer. Returns the
        outcome, the weights and the tree shape a bandit chose for it (None otherwise)."""
        config, depth, timer, learns = self.config, self.proposer.depth, self.timer, self.weights.learns
        arm = getattr(self.proposer, "arm", None)
        with timer.phase("draft"):
            with timer.phase("tabed_draft"):
                weights = self.weights.choose()
                mixing = mixing_weights(weights) if len(config.methods) > 1 else weights
            uniforms = None if self.uniforms is None else self.uniforms[self.blocks]
            self.blocks += 1
            self.proposer.budget = config.max_new_tokens - len(self.output)
            proposal = self.proposer.propose(self.draft_pending, mixing, uniforms, learns)
        with timer.phase("verify"):
            checks = None if uniforms is None else uniforms[self.proposer.draws_per_block:]
            checked = check(self.target_rows, self.target_pending, proposal, self.proposer, config, checks, learns)
            summary = torch.cat([checked.accepted.view(1), checked.next_token.view(1), checked.path_tokens]).double()
            values = torch.cat([summary, weights]).tolist()  # the block's one transfer
            a, token, path = int(values[0]), int(values[1]), [int(v) for v in values[2 : 2 + depth]]
            outcome = settle_block(path[:a], token, gamma=depth, produced=len(self.output),
                                   max_new_tokens=config.max_new_tokens, eos=self.eos)
            self.output.extend(outcome.tokens)
            if outcome.history and learns:
                with timer.phase("tabed"):
                    methods = self.proposer.history(proposal, checked.path, a, outcome.history)
                    self.weights.update(methods, checked.path_probs[: outcome.history])
            if not outcome.stop:
                before = len(self.output) - a  # shared tokens fed before the block
                block = torch.cat([checked.path_tokens[:a], checked.next_token.view(1)])
                keep_accepted(self.target_rows, checked, a, before)
                self.target_pending = block[a : a + 1]
                self.draft_pending = self.proposer.keep(proposal, checked.path, a, before, block)
        return outcome, recorded_weights(values[2 + depth:]), arm

    def _draw_uniforms(self) -> torch.Tensor | None:
        """Sampling's uniforms for every block the sample can take (each yields a token), in
        one copy to the device: per block, the proposer's draws, then the acceptance tests and
        the emitted token (a chain: g proposals, g tests, 1 token). The same values, in the
        same order, as drawing them block by block."""
        if self.config.greedy:
            return None
        per_block = self.proposer.draws_per_block + self.proposer.checks_per_block
        blocks = self.config.max_new_tokens
        return torch.rand(blocks, per_block, generator=self.generator, dtype=torch.float64).to(self.device)


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
    (target_capacity, draft_capacity), steps = capacities(config), StepLog()
    with timer.phase("prefill"):
        target_prompt, draft_prompt = tokenize(target, sample), tokenize(draft, sample)
        with timer.phase("target_prefill"):
            target_rows = prefilled_rows(target, target_prompt, "M", None, engine=engine, capacity=target_capacity,
                                         role="target", step_log=steps, timer=timer)
        copies = config.verify.copies_per_method(len(config.methods))  # a candidate tree's branches: a row each
        with timer.phase("draft_prefill"):
            draft_rows = prefilled_rows(draft, draft_prompt, config.methods * copies, captioner, engine=engine,
                                        capacity=draft_capacity, role="draft", step_log=steps,
                                        span=config.verify.draft_capacity(config.gamma) + 2, timer=timer)
    proposer = proposer_class(config.verify)(draft_rows, config)
    decoder = SpeculativeDecoder(target_rows, proposer, target_prompt.ids[-1], config,
                                 sample_generator(config, sample.sample_id), target.eos_token_ids, timer)
    while True:
        outcome, weights, arm = decoder.block()
        record.accepted_per_block.append(outcome.accepted)
        record.weights_per_block.append(weights)
        if arm is not None:
            record.shape_per_block.append(arm)
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
    with timer.phase("prefill"), timer.phase("target_prefill"):
        prompt = tokenize(target, sample)
        rows = prefilled_rows(target, prompt, "M", None, engine=engine, capacity=max_new_tokens + 1, role="target",
                              step_log=steps, timer=timer)
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
    record.time_tabed_draft_s = seconds["tabed_draft"]
    record.time_tabed_s = seconds["tabed_draft"] + seconds["tabed"]
    record.time_vision_s = seconds["target_vision"] + seconds["draft_vision"]
    record.time_target_prefill_s, record.time_draft_prefill_s = seconds["target_prefill"], seconds["draft_prefill"]
    record.time_total_s = seconds["prefill"] + seconds["draft"] + seconds["verify"]
    record.time_wall_s = time.perf_counter() - timer.started
    return record
