"""Several requests decoded as one batch: greedy SD with a chain or a candidate tree, and its
AR baseline.

The single-request loop (`pipeline.decoding.loop`) batches a request's drafting methods; here
B requests are decoded together, so the draft batch is B x m rows and the target's B rows.
Each request accepts its own number of proposals per block (`pipeline.decoding.ragged_rows`
keeps each row's own prefix), keeps its own TABED weights and history, and stops on its own:
a finished request's rows keep nothing more while the others go on. A block is still one
draft loop, one target forward and one device-to-host transfer. Greedy output equals AR's at
the same batch, request by request, wherever the arithmetic allows (tests measure it).
"""
from __future__ import annotations

import time

import torch

from pipeline.data.sample import Sample
from pipeline.decoding.acceptance import follow_tree, probabilities, recorded_weights, settle_block
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import check_engine, compiles, default_engine
from pipeline.decoding.loop import capacities, finish_record
from pipeline.decoding.prompts import Prompt, check_fits, tokenize
from pipeline.decoding.ragged_rows import RaggedDynamicRows, RaggedRows, RaggedStaticRows
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.timing import PhaseTimer
from pipeline.decoding.trees import candidate_tree
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.methods import method_embeddings, needs_captions
from pipeline.drafting.scoring import mixing_weights
from pipeline.models.base import LVLM, ModelInputError, StepLog


@torch.inference_mode()
def speculative_decode_batch(
    target: LVLM, draft: LVLM, samples: list[Sample], config: DecodeConfig,
    captioner: Captioner | None = None,
    *, engine: str | None = None,
) -> list[SampleRecord]:
    """Greedy SD of `samples` as one batch, verifying chains or candidate trees of `config.gamma`
    proposals; a record per sample, each timed as the whole batch's decode."""
    _check(config)
    engine = engine or default_engine(target, draft)
    timer, steps = PhaseTimer(target.device), StepLog()
    target_capacity, draft_capacity = capacities(config)
    copies = config.verify.copies_per_method(len(config.methods))  # a candidate tree's branches
    with timer.phase("prefill"):
        with timer.phase("target_prefill"):
            prompts = [tokenize(target, s) for s in samples]
            target_rows, _ = _rows(target, prompts, "M", None, engine, target_capacity, "target", steps,
                                   timer)
        with timer.phase("draft_prefill"):
            draft_prompts = [tokenize(draft, s) for s in samples]
            # + 1: a request's block may start with two pending tokens where another's has one
            draft_rows, _ = _rows(draft, draft_prompts, config.methods * copies, captioner, engine,
                                  draft_capacity + 1, "draft", steps, timer)
    records = [SampleRecord(sample_id=s.sample_id, mode="live", engine=engine, batch_requests=len(samples))
               for s in samples]
    first = torch.tensor([p.ids[-1] for p in prompts], device=target.device)
    decoder = BatchDecoder(target_rows, draft_rows, first, config, records, target.eos_token_ids, timer)
    stop = False
    while not stop:
        stop = decoder.block()
    tokens = sum(len(output) for output in decoder.outputs)
    for record, output in zip(records, decoder.outputs):
        finish_record(record, output, target, timer, steps, batch_tokens=tokens)
    return records


class BatchDecoder:
    """A batch's SD run between blocks: each request's rows, pending tokens, weight state,
    output and record. A candidate tree drafts `branches` groups of the m method rows per
    request (the ensembled chain and each method's own), verified as one tree of a fixed node
    count per request."""

    def __init__(self, target_rows: RaggedRows, draft_rows: RaggedRows, first: torch.Tensor,
                 config: DecodeConfig, records: list[SampleRecord], eos: frozenset[int],
                 timer: PhaseTimer) -> None:
        self.target_rows, self.draft_rows = target_rows, draft_rows
        self.config, self.records = config, records
        self.eos, self.timer, self.device, self.batch = eos, timer, first.device, first.shape[0]
        self.methods = len(config.methods)
        self.branches = config.verify.copies_per_method(self.methods)
        self.states = [config.policy.start(self.methods, self.device) for _ in records]
        self.target_pending = first
        # the draft's pending tokens, right-aligned: one, or two after a fully accepted chain
        self.draft_pending, self.draft_valid = torch.stack([first, first], 1), [1] * self.batch
        self.outputs: list[list[int]] = [[] for _ in records]
        self.stopped = [False] * self.batch

    def block(self) -> bool:
        """Draft, verify and settle one block of every request with one device-to-host transfer.
        Returns whether every request has stopped."""
        timer, batch, gamma = self.timer, self.batch, self.config.gamma
        with timer.phase("draft"):
            with timer.phase("tabed_draft"):
                weights = torch.stack([state.choose() for state in self.states])  # [B, m] float64
            chains, method_probs = self._propose(mixing_weights(weights)[:, None, :])
        with timer.phase("verify"):
            logits, accepted, next_token, path, branch = self._verify(chains)
            path_tokens = chains[torch.arange(batch, device=self.device), branch]  # [B, gamma]
            summary = torch.cat([accepted, next_token, path_tokens.flatten()]).double()
            # the one transfer
            block = BatchBlock(torch.cat([summary, weights.flatten()]).tolist(), batch, gamma, self.methods)
            history = self._settle(block, path, branch)
            if self.states[0].learns and any(history):
                with timer.phase("tabed"):
                    self._learn(history, logits, path, method_probs, branch)
            if not all(self.stopped):
                self.target_pending = next_token
                full = accepted == gamma  # the last proposal was never fed to the draft
                before = torch.where(full, path_tokens[:, -1], next_token)  # a filler unless `full`
                self.draft_pending = torch.stack([before, next_token], 1)
                self.draft_valid = [2 if a == gamma else 1 for a in block.accepted]
        return all(self.stopped)

    def _propose(self, mixing: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every request's chains `[B, branches, gamma]` (branch 0 the mixture's, 1 + i method i's
        own) and each method's distributions along them `[B, branches, gamma, m, V]`."""
        batch, m, branches, gamma = self.batch, self.methods, self.branches, self.config.gamma
        per_request = branches * m
        valid = [v for v in self.draft_valid for _ in range(per_request)]
        logits = self.draft_rows.feed_ragged(self.draft_pending.repeat_interleave(per_request, 0), valid)
        own = torch.arange(m, device=self.device)
        tokens, method_probs = [], []
        for i in range(gamma):
            q = probabilities(logits[:, -1], 0.0).view(batch, branches, m, -1)
            ensemble = torch.matmul(mixing, q[:, 0]) if m > 1 else q[:, 0, :1]  # [B, 1, V]
            dists = torch.cat([ensemble, q[:, 1 + own, own]], 1) if branches > 1 else ensemble
            token = dists.argmax(-1)  # [B, branches]
            tokens.append(token)
            method_probs.append(q)
            if i < gamma - 1:
                logits = self.draft_rows.feed_ragged(token.repeat_interleave(m, 1).reshape(-1, 1))
        return torch.stack(tokens, 2), torch.stack(method_probs, 2)

    def _verify(self, chains: torch.Tensor):
        """The target's one forward over each request's pending token and proposals, and greedy
        acceptance: (logits `[B, fed, V]`, accepted `[B]`, next token `[B]`, the accepted
        path's fed positions `[B, gamma + 1]` (None for a chain), the branch that drafted it `[B]`)."""
        gamma = self.config.gamma
        if self.branches == 1:
            proposals = chains[:, 0]
            fed = torch.cat([self.target_pending[:, None], proposals], 1)
            logits = self.target_rows.feed_ragged(fed, keep=gamma + 1)  # [B, gamma + 1, V]
            target_ids = logits.argmax(-1)
            accepted = (proposals == target_ids[:, :-1]).long().cumprod(1).sum(1)  # [B]
            next_token = target_ids.gather(1, accepted[:, None])[:, 0]
            return logits, accepted, next_token, None, torch.zeros_like(accepted)
        trees = [candidate_tree(c, merge=True) for c in chains]
        fed = torch.stack([torch.cat([p.view(1), t.tokens]) for p, t in zip(self.target_pending, trees)])
        depths = torch.stack([t.fed_depths() for t in trees])
        sees = torch.stack([t.ancestry() for t in trees])
        logits = self.target_rows.feed_ragged_tree(fed, depths, sees, keep=fed.shape[1])
        outcomes = [follow_tree(t, l.argmax(-1)) for t, l in zip(trees, logits)]
        stack = lambda name: torch.stack([getattr(o, name) for o in outcomes])
        accepted, path = stack("accepted"), stack("path")
        # the first branch holding the deepest accepted node; the ensembled one when none was
        branch = (path.gather(1, accepted[:, None])[:, 0] - 1).clamp_min(0) // gamma
        return logits, accepted, stack("next_token"), path, branch

    def _learn(self, history: list[int], logits: torch.Tensor, path: torch.Tensor | None,
               method_probs: torch.Tensor, branch: torch.Tensor) -> None:
        """Each request's weight state learns from its accepted branch's first `history` positions."""
        if path is not None:  # the root and the accepted nodes, by depth
            logits = logits.gather(1, path[:, :, None].expand(-1, -1, logits.shape[-1]))
        p = probabilities(logits, 0.0)
        methods = method_probs[torch.arange(self.batch, device=self.device), branch]  # [B, gamma, m, V]
        for b, h in enumerate(history):
            if h:
                self.states[b].update(methods[b, :h], p[b, :h])

    def _settle(self, block: BatchBlock, path: torch.Tensor | None, branch: torch.Tensor) -> list[int]:
        """Each running request's block through `settle_block`, recorded; then both models' rows
        keep what each request kept (a tree's path for the target; the draft's rows continue
        the accepted branch). Returns each request's history positions."""
        gamma, m = self.config.gamma, self.methods
        target_keep, draft_keep, history = [0] * self.batch, [0] * self.batch, [0] * self.batch
        for b in range(self.batch):
            if self.stopped[b]:
                continue
            a = block.accepted[b]
            outcome = settle_block(block.proposals[b][:a], block.next_token[b], gamma=gamma,
                                   produced=len(self.outputs[b]), max_new_tokens=self.config.max_new_tokens,
                                   eos=self.eos)
            self.outputs[b].extend(outcome.tokens)
            self.records[b].accepted_per_block.append(outcome.accepted)
            self.records[b].weights_per_block.append(block.weights[b])
            self.stopped[b], history[b] = outcome.stop, outcome.history
            if outcome.stop:  # the block's transfer has synchronised the host with the device
                self.records[b].time_request_s = time.perf_counter() - self.timer.started
            else:  # the target keeps the pending token and the accepted proposals
                target_keep[b], draft_keep[b] = 1 + a, self.draft_valid[b] + min(a, gamma - 1)
        if all(self.stopped):
            return history
        if self.branches > 1:
            self.draft_rows.copy_rows(self.branches, branch, self.draft_rows.base)
        self.target_rows.settle(target_keep, path)
        self.draft_rows.settle([k for k in draft_keep for _ in range(m * self.branches)])
        return history


@torch.inference_mode()
def autoregressive_decode_batch(
    target: LVLM, samples: list[Sample], *, max_new_tokens: int, engine: str | None = None,
) -> list[SampleRecord]:
    """The greedy baseline of a batch: the target alone, one token per request per forward,
    through the same ragged rows as SD at that batch; the first token comes from the prefill,
    as in transformers' `generate`."""
    DecodeConfig(max_new_tokens=max_new_tokens).validate()
    engine = engine or default_engine(target)
    timer, steps = PhaseTimer(target.device), StepLog()
    with timer.phase("prefill"), timer.phase("target_prefill"):
        prompts = [tokenize(target, s) for s in samples]
        rows, prefilled = _rows(target, prompts, "M", None, engine, max_new_tokens, "target", steps, timer,
                                whole=True)
    pending = prefilled[:, -1].argmax(-1)
    outputs, stopped = [[] for _ in samples], [False] * len(samples)
    records = [SampleRecord(sample_id=s.sample_id, mode="ar", engine=engine, batch_requests=len(samples))
               for s in samples]
    while True:
        with timer.phase("verify"):
            for b, token in enumerate(pending.tolist()):  # the step's one transfer
                if stopped[b]:
                    continue
                outcome = settle_block([], token, gamma=1, produced=len(outputs[b]),
                                       max_new_tokens=max_new_tokens, eos=target.eos_token_ids)
                outputs[b].extend(outcome.tokens)
                records[b].accepted_per_block.append(0)
                stopped[b] = outcome.stop
                if outcome.stop:
                    records[b].time_request_s = time.perf_counter() - timer.started
            if all(stopped):
                break
            pending = rows.feed_ragged(pending[:, None])[:, -1].argmax(-1)
            rows.settle([0 if stop else 1 for stop in stopped])  # the token fed, by those still going
    tokens = sum(len(output) for output in outputs)
    for record, output in zip(records, outputs):
        finish_record(record, output, target, timer, steps, batch_tokens=tokens)
    return records


class BatchBlock:
    """A verified batch block as the host reads it from the one transfer: per request the
    accepted count, the target's next token, the chain of proposals and the weights it used."""

    def __init__(self, values: list[float], batch: int, gamma: int, methods: int) -> None:
        as_int = lambda part: [int(v) for v in part]
        self.accepted, self.next_token = as_int(values[:batch]), as_int(values[batch : 2 * batch])
        chains = values[2 * batch : 2 * batch + batch * gamma]
        self.proposals = [as_int(chains[b * gamma : (b + 1) * gamma]) for b in range(batch)]
        weights = values[2 * batch + batch * gamma :]
        self.weights = [recorded_weights(weights[b * methods : (b + 1) * methods]) for b in range(batch)]


def _check(config: DecodeConfig) -> None:
    config.validate()
    if config.is_ar:
        raise ValueError("the AR baseline has no draft: decode it with autoregressive_decode_batch")
    if not config.greedy:
        raise ValueError("a batch decodes greedily only; sampled SD runs one request at a time")
    if not config.verify.batches:
        raise ValueError(f"a batch verifies chains and candidate trees, not {config.verify.label} trees: "
                         "other trees decode one request at a time (batch 1)")


def _rows(model: LVLM, prompts: list[Prompt], methods: str, captioner: Captioner | None, engine: str,
          capacity: int, role: str, steps: StepLog, timer: PhaseTimer,
          whole: bool = False) -> tuple[RaggedRows, torch.Tensor]:
    """Ragged rows of every prompt under every method (request-major), prefilled with
    `prompt[:-1]`: the last token is fed with the first block; and the prefill's last logits.
    `whole`: prefilled with the whole prompt (AR reads its first token from those logits)."""
    check_engine(engine)
    if getattr(model, "recurrent", False):
        raise ModelInputError(f"{model.name}: a state-space model cannot decode a batch of requests yet")
    embeds = []
    with timer.phase(f"{role}_vision"):
        for prompt in prompts:
            check_fits(model, len(prompt.ids) + capacity, prompt)
            captions = None
            if needs_captions(methods):
                if captioner is None:
                    raise ModelInputError(f"caption drafting in {methods!r} needs a captioner")
                captions = [captioner.caption(image) for image in prompt.images]
            cut = None if whole else -1
            mine = [method_embeddings(model, m, prompt.ids, prompt.images, captions)[:cut] for m in methods]
            check_fits(model, max(len(e) for e in mine) + 1 + capacity, prompt)
            embeds += mine
    if engine == "eager":
        rows = RaggedDynamicRows(model, embeds, steps)
    else:
        rows = RaggedStaticRows(model, embeds, capacity=capacity, compiled=compiles(model.device), role=role,
                                step_log=steps)
    prefilled = rows.prefill()
    rows.start_ragged()
    return rows, prefilled
