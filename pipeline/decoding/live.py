"""The live speculative decoding loop (SPEC §1, §3) and its autoregressive baseline.

One block: choose ensemble weights w* from the history, draft `gamma` tokens with every
drafting method as one batch, mix the methods' next-token distributions with w*, let the
target score all proposals in ONE forward, accept, crop both caches. The sequence shared by
every row starts with the prompt's last token, so both models prefill `prompt[:-1]` once and
then only ever "feed what is not cached yet" — no special first block.
"""
from __future__ import annotations

import time
import zlib
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.verify import sample_token, verify_greedy, verify_sampling
from pipeline.drafting.batch import BatchedRows
from pipeline.drafting.captioner import Captioner
from pipeline.drafting.methods import method_embeddings
from pipeline.drafting.policies import History, choose_weights, mix
from pipeline.models.base import LVLM, ModelInputError


class PhaseTimer:
    """Seconds per phase, measured after device sync so GPU work is counted where it runs."""

    def __init__(self, *models: LVLM) -> None:
        self.models = models
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        for model in self.models:
            model.synchronize()
        self.seconds[name] += time.perf_counter() - start

    def fill(self, record: SampleRecord) -> None:
        record.time_prefill_s = self.seconds["prefill"]
        record.time_draft_s = self.seconds["draft"]
        record.time_verify_s = self.seconds["verify"]
        record.time_total_s = sum(self.seconds.values())


@dataclass
class Prompt:
    """A tokenized prompt checked for decoding: ids with one placeholder per image."""

    ids: list[int]
    images: Sequence[Image.Image]


def tokenize(model: LVLM, sample: Sample) -> Prompt:
    if sample.error:
        raise ModelInputError(sample.error)
    sample.check()
    ids = model.tokenize_prompt(sample.prompt)
    if model.image_token_id is not None and ids[-1] == model.image_token_id:
        raise ModelInputError(f"sample {sample.sample_id}: a prompt must end with text, not an image")
    return Prompt(ids, sample.images)


def prefilled_rows(model: LVLM, prompt: Prompt, methods: str, captioner: Captioner | None) -> BatchedRows:
    """One row per method holding `prompt[:-1]` in the cache; the last token is fed later."""
    captions = None
    if "C" in methods:
        if captioner is None:
            raise ModelInputError("caption drafting (C) needs a captioner")
        captions = [captioner.caption(image) for image in prompt.images]
    rows = BatchedRows(
        model, [method_embeddings(model, m, prompt.ids, prompt.images, captions)[:-1] for m in methods]
    )
    rows.prefill()
    return rows


def sample_generator(config: DecodeConfig, sample_id: str) -> torch.Generator:
    """A CPU generator seeded by (seed, sample): reproducible, independent of device and order."""
    return torch.Generator().manual_seed(zlib.crc32(f"{config.seed}:{sample_id}".encode()))


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits / (temperature or 1.0), dim=-1)


def cut_at_stop(tokens: list[int], budget: int, eos: set[int]) -> tuple[list[int], bool]:
    """Tokens kept from a block: at most `budget`, ending at the first EOS; and whether to stop."""
    kept = tokens[:budget]
    for i, token in enumerate(kept):
        if token in eos:
            return kept[: i + 1], True
    return kept, len(kept) == budget


@torch.inference_mode()
def speculative_decode(
    target: LVLM,
    draft: LVLM,
    sample: Sample,
    config: DecodeConfig,
    captioner: Captioner | None = None,
) -> SampleRecord:
    """Decode one sample with SD; greedy output is token-identical to the target's own."""
    config.validate()
    timer = PhaseTimer(target, draft)
    record = SampleRecord(sample_id=sample.sample_id, mode="live")
    methods, gamma, policy = config.methods, config.gamma, config.policy
    generator = sample_generator(config, sample.sample_id)
    with timer.phase("prefill"):
        target_prompt, draft_prompt = tokenize(target, sample), tokenize(draft, sample)
        target_rows = prefilled_rows(target, target_prompt, "M", None)
        draft_rows = prefilled_rows(draft, draft_prompt, methods, captioner)
    shared = [target_prompt.ids[-1]]  # the continuation every row shares; output = shared[1:]
    history = History(len(methods), policy)
    while True:
        with timer.phase("draft"):
            weights = choose_weights(history)
            logits = draft_rows.feed(shared[draft_rows.fed:])[:, -1]
            proposals, method_probs, mixed_probs = [], [], []
            for i in range(gamma):
                q = probabilities(logits, config.temperature)  # [m, V]
                mixed = mix(q, weights)
                token = int(mixed.argmax()) if config.greedy else sample_token(mixed, generator)
                proposals.append(token)
                method_probs.append(q)
                mixed_probs.append(mixed)
                if i < gamma - 1:
                    logits = draft_rows.feed([token])[:, -1]
        with timer.phase("verify"):
            target_logits = target_rows.feed(shared[target_rows.fed:] + proposals, keep=gamma + 1)[0]
            p = probabilities(target_logits, config.temperature)
            proposed = torch.tensor(proposals, device=p.device)
            if config.greedy:
                accepted, next_token = verify_greedy(proposed, target_logits)
            else:
                accepted, next_token = verify_sampling(proposed, p, torch.stack(mixed_probs), generator)
            if history.tracks:  # positions where q_i and p both saw the true prefix
                seen = min(accepted + 1, gamma)
                history.add(torch.stack(method_probs[:seen]), p[:seen])
            before = len(shared)
            budget = config.max_new_tokens - (before - 1)
            kept, stop = cut_at_stop(proposals[:accepted] + [next_token], budget, target.eos_token_ids)
            record.accepted_per_block.append(min(accepted, len(kept)))
            record.weights_per_block.append([round(float(w), 6) for w in weights])
            shared.extend(kept)
            if stop:
                break
            target_rows.keep_shared(before + accepted)
            draft_rows.keep_shared(before + min(accepted, gamma - 1))
    record.output_ids = shared[1:]
    record.output_text = target.tokenizer.decode(record.output_ids, skip_special_tokens=True)
    timer.fill(record)
    return record


@torch.inference_mode()
def autoregressive_decode(
    target: LVLM, sample: Sample, *, max_new_tokens: int, temperature: float = 0.0, seed: int = 0
) -> SampleRecord:
    """The baseline: the target alone, one token per forward, through the same rows and cache
    code as SD so that timings compare like with like. Every token is a block of tau 1."""
    config = DecodeConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    config.validate()
    timer = PhaseTimer(target)
    record = SampleRecord(sample_id=sample.sample_id, mode="ar")
    generator = sample_generator(config, sample.sample_id)
    with timer.phase("prefill"):
        prompt = tokenize(target, sample)
        rows = prefilled_rows(target, prompt, "M", None)
    shared = [prompt.ids[-1]]
    stop = False
    while not stop:
        with timer.phase("verify"):
            logits = rows.feed(shared[rows.fed:])[0, -1]
            token = int(logits.argmax()) if config.greedy else sample_token(probabilities(logits, temperature), generator)
            kept, stop = cut_at_stop([token], max_new_tokens - (len(shared) - 1), target.eos_token_ids)
            shared.extend(kept)
            record.accepted_per_block.append(0)
    record.output_ids = shared[1:]
    record.output_text = target.tokenizer.decode(record.output_ids, skip_special_tokens=True)
    timer.fill(record)
    return record
