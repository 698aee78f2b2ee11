"""The live decoding loop (docs/algorithm.md §1, §3) for B >= 1 requests, and its autoregressive
baseline. Batch 1 is B = 1: there is no other path.

One block reads top to bottom in `Decoder.block`: each request's ensemble weights w* from its
history, the draft proposes for every request with every drafting method as one batch (the
proposer, `pipeline.decoding.draft`: a chain or a token tree), the target scores each request's
pending token and proposals in ONE forward and accepts (`pipeline.decoding.target`), the block
is read back in one transfer (`BlockResult`), each request settles it (`acceptance.settle_block`:
what is kept, recorded and learned, the same rule trace replay uses) and both models' rows roll
back to each accepted path. Requests accept their own counts, keep their own TABED weights and
stop on their own; a stopped request's rows ride along until the batch ends. The sequence every
row shares starts with the prompt's last token, so SD prefills `prompt[:-1]` once and then only
feeds what is not cached yet: there is no special first block.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Sequence

import torch

from pipeline.data.sample import Sample
from pipeline.decoding.acceptance import probabilities, recorded_weights, sample_tokens, settle_block
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import Proposer, proposer_class
from pipeline.decoding.proposals import Pending, Proposal, Verified
from pipeline.decoding.engine import default_engine, prefilled_rows
from pipeline.decoding.inputs import tokenize
from pipeline.decoding.outcomes import finish_records, new_records
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.rows_protocol import Rows
from pipeline.decoding.target import Checked, check, keep_accepted
from pipeline.decoding.timing import PhaseTimer
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.scoring import mixing_weights
from pipeline.models.base import LAST_HIDDEN, LVLM, StepLog


@torch.inference_mode()
def speculative_decode(
    target: LVLM, draft: LVLM, samples: Sequence[Sample], config: DecodeConfig,
    captioner: Captioner | None = None, *, engine: str | None = None,
) -> list[SampleRecord]:
    """Decode `samples` as one batch with SD, a record each; greedy output is token-identical
    to the target's own. `engine`: `static` or `eager` (None: the device's default)."""
    config.validate()
    if config.is_ar:
        raise ValueError("the AR baseline has no draft: decode it with autoregressive_decode")
    engine = engine or default_engine(target, draft)
    timer, steps = PhaseTimer(target.device), StepLog()
    records = new_records(samples, "live", engine)
    target_capacity, draft_capacity = capacities(config)
    proposer = proposer_class(config.verify)(config)
    reads = draft.target_layers  # a head reads the target's states at every position
    with timer.phase("prefill"):
        target_prompts = [tokenize(target, s) for s in samples]
        for record, prompt in zip(records, target_prompts):
            record.prompt_tokens = len(prompt.ids)
        draft_prompts = [tokenize(draft, s) for s in samples]
        with timer.phase("target_prefill"):
            target_rows, prefill = prefilled_rows(target, target_prompts, "M", None, engine=engine,
                                                  capacity=target_capacity, role="target", step_log=steps,
                                                  timer=timer, hidden=reads)
        prompt_states = target_rows.prompt_states(prefill[1]) if reads else None
        # a candidate tree's branches: a row each
        copies = config.verify.copies_per_method(len(config.methods))
        with timer.phase("draft_prefill"):
            draft_rows, _ = prefilled_rows(draft, draft_prompts, config.methods * copies, captioner,
                                           engine=engine, capacity=draft_capacity, role="draft",
                                           step_log=steps, timer=timer,
                                           span=config.verify.draft_capacity(config.gamma) + 2,
                                           target_states=prompt_states)
    proposer.start(draft_rows)
    first = torch.tensor([p.ids[-1] for p in target_prompts], device=target.device)
    # the target's states before the prompt's last token: what a head reads beside it
    first_features = prefill[1][:, -1:] if reads else None
    generators = [sample_generator(config.seed, s.sample_id) for s in samples]
    decoder = Decoder(target_rows, proposer, first, config, records, generators, target.eos_token_ids, timer,
                      reads or ((LAST_HIDDEN,) if proposer.wants_target_hidden else ()), first_features,
                      draft.target_top_k)
    while not decoder.block():
        pass
    return finish_records(records, decoder.outputs, target, timer, steps)


@dataclass(frozen=True)
class BlockResult:
    """A verified block as the host reads it, from the block's one device-to-host transfer,
    per request: the `accepted` proposals' tokens `proposals`, the target's `next_token` after
    them and the weights w* the block drafted with (as records keep them)."""

    accepted: list[int]
    proposals: list[list[int]]
    next_token: list[int]
    weights: list[list[float]]

    @staticmethod
    def read(checked: Checked, weights: torch.Tensor) -> BlockResult:
        requests, gamma = checked.path_tokens.shape
        parts = [checked.accepted, checked.next_token, checked.path_tokens.flatten()]
        values = torch.cat([torch.cat(parts).double(), weights.flatten()]).tolist()  # the one transfer
        accepted = [int(v) for v in values[:requests]]
        chains = values[2 * requests : 2 * requests + requests * gamma]
        methods = weights.shape[1]
        weight_values = values[2 * requests + requests * gamma :]
        proposals = [[int(v) for v in chains[b * gamma : b * gamma + a]] for b, a in enumerate(accepted)]
        weights_of = [recorded_weights(weight_values[b * methods : (b + 1) * methods])
                      for b in range(requests)]
        return BlockResult(accepted, proposals, [int(v) for v in values[requests : 2 * requests]], weights_of)


class Decoder:
    """B requests' SD run between blocks: the target's rows, the proposer (which holds the
    draft's rows), the tokens each has not seen yet, each request's weight state, output,
    record and whether it is still running."""

    def __init__(self, target_rows: Rows, proposer: Proposer, first: torch.Tensor, config: DecodeConfig,
                 records: list[SampleRecord], generators: list[torch.Generator], eos: set[int],
                 timer: PhaseTimer, reads: tuple[int, ...] = (),
                 first_features: torch.Tensor | None = None, top_k: int = 0) -> None:
        self.target_rows, self.proposer, self.records = target_rows, proposer, records
        self.config, self.eos, self.timer = config, eos, timer
        self.reads = reads  # the target's hidden states each verify returns, for the draft's side
        self.top_k = top_k  # the target's top tokens each verify returns at every fed position
        self.device = first.device
        self.states = [config.policy.start(len(config.methods), self.device) for _ in records]
        self.learns = self.states[0].learns
        self.uniforms = self._draw_uniforms(generators)
        self.target_pending = first
        self.draft_pending = Pending(first[:, None], [1] * len(records), first_features)
        self.outputs: list[list[int]] = [[] for _ in records]
        self.running = [True] * len(records)
        self.blocks = 0

    def block(self) -> bool:
        """Draft, verify and settle one block of every request with exactly one device-to-host
        transfer; record it. Returns whether every request has stopped."""
        config, timer, proposer = self.config, self.timer, self.proposer
        uniforms = None if self.uniforms is None else self.uniforms[:, self.blocks]
        with timer.phase("draft"):
            with timer.phase("tabed_draft"):
                weights = torch.stack([state.choose() for state in self.states])  # [B, m] float64
                mixing = mixing_weights(weights)
            budgets = [config.max_new_tokens - len(out) if run else 0 for out,
                       run in zip(self.outputs, self.running)]
            proposal = proposer.propose(self.draft_pending, mixing, budgets, uniforms)
        with timer.phase("verify"):
            checks = None if uniforms is None else uniforms[:, proposer.draws_per_block :]
            checked = check(self.target_rows, self.target_pending, proposal, config, checks, self.learns,
                            hidden=self.reads, top_k=self.top_k)
            result = BlockResult.read(checked, weights)
            history = self._settle(result, proposal)
            if self.learns and any(history):
                with timer.phase("tabed"):
                    self._learn(proposal, checked, history)
            if any(self.running):
                keep_accepted(self.target_rows, checked, result.accepted, self.running)
                self.target_pending = checked.next_token
                verified = Verified(result.accepted, checked.accepted, checked.next_token, checked.path,
                                    checked.path_tokens, list(self.running), checked.hidden)
                self.draft_pending = proposer.learn(proposal, verified)
                if checked.observed is not None:
                    proposer.observe_target(*checked.observed)
        self.blocks += 1
        return not any(self.running)

    def _settle(self, result: BlockResult, proposal: Proposal) -> list[int]:
        """Each running request's block through `settle_block`, recorded; returns how many
        positions each request's history learns from."""
        history = [0] * len(self.records)
        for b, record in enumerate(self.records):
            if not self.running[b]:
                continue
            outcome = settle_block(result.proposals[b], result.next_token[b], gamma=proposal.gammas[b],
                                   produced=len(self.outputs[b]), max_new_tokens=self.config.max_new_tokens,
                                   eos=self.eos)
            self.outputs[b].extend(outcome.tokens)
            record.stamp_first_token(self.outputs[b], self.timer.started)
            record.accepted_per_block.append(outcome.accepted)
            record.weights_per_block.append(result.weights[b])
            if proposal.arms is not None:
                record.shape_per_block.append(proposal.arms[b])
            history[b] = outcome.history
            if outcome.stop:  # the block's transfer has synchronised the host with the device
                self.running[b] = False
                record.time_request_s = time.perf_counter() - self.timer.started
        return history

    def _learn(self, proposal: Proposal, checked: Checked, history: list[int]) -> None:
        """Each request's weight state learns from its accepted path's first `history` positions."""
        methods = proposal.history(checked.path, checked.accepted)  # [B, gamma, m, V]
        for b, positions in enumerate(history):
            if positions:
                self.states[b].update(methods[b, :positions], checked.path_probs[b, :positions])

    def _draw_uniforms(self, generators: list[torch.Generator]) -> torch.Tensor | None:
        """Sampling's uniforms for every block each request can take (each yields a token), in
        one copy to the device `[B, blocks, per block]`: per block, the proposer's draws, then
        the acceptance tests and the emitted token (a chain: g proposals, g tests, 1 token). The
        same values, in the same order, as drawing them block by block from the request's own
        generator, so a request draws what it draws alone whatever batch it runs in."""
        if self.config.greedy:
            return None
        per_block = self.proposer.draws_per_block + self.proposer.checks_per_block
        shape = (self.config.max_new_tokens, per_block)
        return torch.stack(
            [torch.rand(shape, generator=g, dtype=torch.float64) for g in generators]
        ).to(self.device)


@torch.inference_mode()
def autoregressive_decode(
    target: LVLM, samples: Sequence[Sample], *, max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
    engine: str | None = None,
) -> list[SampleRecord]:
    """The baseline: the target alone, one token per request per forward, through the same rows
    and cache code as SD so that timings compare like with like. The first token comes from the
    prefill, as in transformers' `generate`; every token is a block of tau 1."""
    config = DecodeConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    config.validate()
    engine = engine or default_engine(target)
    timer, steps = PhaseTimer(target.device), StepLog()
    records = new_records(samples, "ar", engine)
    with timer.phase("prefill"), timer.phase("target_prefill"):
        prompts = [tokenize(target, s) for s in samples]
        for record, prompt in zip(records, prompts):
            record.prompt_tokens = len(prompt.ids)
        rows, logits = prefilled_rows(target, prompts, "M", None, engine=engine, capacity=max_new_tokens,
                                      role="target", step_log=steps, timer=timer, whole=True)
    uniforms = None
    if not config.greedy:  # each request's own draws, one per token, as it draws them alone
        draws = [torch.rand(max_new_tokens, generator=sample_generator(seed, s.sample_id),
                            dtype=torch.float64) for s in samples]
        uniforms = torch.stack(draws).to(target.device)
    outputs, running = [[] for _ in samples], [True] * len(samples)
    for step in range(max_new_tokens):
        with timer.phase("verify"):
            last = logits[:, -1]
            token = last.argmax(-1) if uniforms is None else sample_tokens(probabilities(last, temperature),
                                                                            uniforms[:, step])
            for b, value in enumerate(token.tolist()):  # the step's one transfer
                if running[b]:
                    outcome = settle_block([], value, gamma=1, produced=len(outputs[b]),
                                           max_new_tokens=max_new_tokens, eos=target.eos_token_ids)
                    outputs[b].extend(outcome.tokens)
                    records[b].stamp_first_token(outputs[b], timer.started)
                    records[b].accepted_per_block.append(0)
                    if outcome.stop:
                        running[b] = False
                        records[b].time_request_s = time.perf_counter() - timer.started
            if not any(running):
                break
            logits = rows.feed(token[:, None])
            rows.settle([int(run) for run in running])  # the token fed, by those still going
    return finish_records(records, outputs, target, timer, steps)


def sample_generator(seed: int, sample_id: str) -> torch.Generator:
    """A CPU generator seeded by (seed, sample): reproducible, independent of device, order and batch."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{sample_id}".encode()))


def capacities(config: DecodeConfig) -> tuple[int, int]:
    """Continuation slots the target's and the draft's rows may need: the budget plus what one
    block feeds beyond it (a tree's nodes; a tree's levels in the draft, and a second pending
    token)."""
    nodes = config.verify.tree_nodes(config.gamma, len(config.methods))
    draft_feeds = config.verify.draft_capacity(config.gamma)
    return config.max_new_tokens + nodes + 1, config.max_new_tokens + draft_feeds + 2
