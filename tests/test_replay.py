"""Trace replay equals the live engine EXACTLY, checked on fake models whose logits do not
depend on how positions are chunked into forwards.

Real transformer forwards round differently for different chunk shapes (see
test_replay_tiny.py); these fakes compute each position's logits from its full prefix with
the same tensor shapes every time, so live and replay see bit-identical distributions and
every difference would be a logic error in replay: no tolerance anywhere here.
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.decoding.loop import speculative_decode
from pipeline.decoding.traces import ForwardCounter, collect_traces
from pipeline.decoding.replay import replay
from pipeline.models.base import LVLM
from pipeline.models.tiny import build_tokenizer
from tests.conftest import FixedCaptioner

HIDDEN = 16
MAX_NEW = 40


class FakeCache:
    """Per-row list of the embeddings fed so far; `crop(-n)` drops the last n of every row."""

    def __init__(self) -> None:
        self.rows: list[list[torch.Tensor]] = []

    def crop(self, n: int) -> None:
        assert n < 0, "the engine crops by a negative count (transformers 5.x)"
        self.rows = [row[:n] for row in self.rows]


class FakeLVLM(LVLM):
    """A deterministic 'language model': logits of a position are a fixed function of the
    mean and the last of its prefix embeddings, computed per position and per row. A draft is
    the same function with noise on the output head, so it agrees with the target often."""

    def __init__(self, tokenizer, name: str, noise: float, eos_step: float) -> None:
        self.tokenizer, self.name = tokenizer, name
        self.device, self.dtype = torch.device("cpu"), torch.float64
        self.image_token_id = tokenizer.convert_tokens_to_ids("<image>")
        base = torch.Generator().manual_seed(0)
        vocab = len(tokenizer)
        self.table = torch.randn(vocab, HIDDEN, generator=base, dtype=torch.float64)
        self.pixels = torch.randn(3, HIDDEN, generator=base, dtype=torch.float64)
        self.mixer = torch.randn(2 * HIDDEN, HIDDEN, generator=base, dtype=torch.float64)
        self.head = 3.0 * torch.randn(HIDDEN, vocab, generator=base, dtype=torch.float64)
        noisy = torch.Generator().manual_seed(1)
        self.head += noise * torch.randn(HIDDEN, vocab, generator=noisy, dtype=torch.float64)
        self.eos_step = eos_step  # EOS grows likelier with length, so samples end at varied points

    @property
    def supports_pooling(self) -> bool:
        return True

    def image_features(self, images, pooled=False):
        side = 2 if pooled else 4
        return [
            torch.tensor(list(img.convert("RGB").resize((side, side)).getdata()), dtype=torch.float64) / 255 @ self.pixels
            for img in images
        ]

    def embed_tokens(self, ids):
        return self.table[ids]

    def _next_logits(self, prefix: list[torch.Tensor]) -> torch.Tensor:
        x = torch.stack(prefix)
        hidden = torch.tanh(torch.cat([x.mean(0), x[-1]]) @ self.mixer)
        logits = hidden @ self.head
        logits[self.tokenizer.eos_token_id] += self.eos_step * len(prefix) - 9.0
        return logits

    def logits(self, *, cache, attention_mask, position_ids, input_ids=None, inputs_embeds=None, keep=1):
        embeds = self.table[input_ids] if inputs_embeds is None else inputs_embeds
        batch, n = embeds.shape[:2]
        if not cache.rows:
            cache.rows = [[] for _ in range(batch)]
        # a new token is real (not left padding) when the 4-D mask lets it see its own slot
        new_mask = attention_mask[:, 0, :, -n:].diagonal(dim1=-2, dim2=-1) == 0
        out = torch.zeros(batch, n, self.table.shape[0], dtype=torch.float64)
        for row in range(batch):
            for j in range(n):
                if new_mask[row, j]:  # left padding is never part of a prefix
                    cache.rows[row].append(embeds[row, j])
                    out[row, j] = self._next_logits(cache.rows[row])
        return out[:, -keep:].float()

    def new_cache(self) -> FakeCache:
        return FakeCache()


@pytest.fixture(scope="module")
def fake_pair():
    tokenizer = build_tokenizer()
    return (
        FakeLVLM(tokenizer, "fake-target", noise=0.0, eos_step=0.3),
        FakeLVLM(tokenizer, "fake-draft", noise=1.2, eos_step=0.3),
    )


def _image(seed: int) -> Image.Image:
    rng = random.Random(seed)
    return Image.frombytes("RGB", (8, 8), bytes(rng.randrange(256) for _ in range(8 * 8 * 3)))


_QUESTIONS = [
    "What is in this image?", "Describe the picture in detail.", "How many circle are there?",
    "What color is the square on the left?", "Explain why the sky is blue.", "Please describe the story.",
    "Is there a cat or a dog?", "What shape is at the top?",
]


def make_samples(count: int) -> list[Sample]:
    """Varied prompts: one image, two images, none; questions and images differ per row."""
    samples = []
    for row in range(count):
        question = _QUESTIONS[row % len(_QUESTIONS)]
        if row % 5 == 3:
            prompt, images = f"USER: Source: <image> Target: <image> {question} ASSISTANT:", (_image(row), _image(100 + row))
        elif row % 7 == 5:
            prompt, images = f"USER: {question} ASSISTANT:", ()
        else:
            prompt, images = f"USER: <image>\n{question} ASSISTANT:", (_image(row),)
        samples.append(Sample("fake", "test", row, "first", prompt, images))
    return samples


def policy_configs() -> list[DecodeConfig]:
    """Every method set (in non-canonical orders too) and every policy knob replay must mirror."""
    static = [DecodeConfig(methods=m) for m in ("M", "T", "C", "P", "MT", "MTC", "MTP", "MTCP", "PC")]
    grid = [
        DecodeConfig(methods="MT", policy=GridSearchPolicy(measure=measure, distance=distance))
        for measure in ("hard", "soft", "hard+soft")
        for distance in ("kl", "tvd")
    ]
    grid += [
        DecodeConfig(methods="TM", policy=GridSearchPolicy(window=4)),
        DecodeConfig(methods="MTCP", policy=GridSearchPolicy(measure="hard+soft", window=16, steps=5)),
        DecodeConfig(methods="MTC", policy=GridSearchPolicy(measure="soft", distance="tvd", steps=4)),
    ]
    inverse = [
        DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(distance=d, temperature=t, window=w))
        for d, t, w in (("kl", 1.0, None), ("tvd", 1.0, None), ("kl", 0.5, 1), ("tvd", 2.0, 4))
    ]
    inverse.append(DecodeConfig(methods="CM", policy=InverseErrorPolicy()))
    return static + grid + inverse


SAMPLES = make_samples(24)


@pytest.fixture(scope="module")
def traces(fake_pair):
    target, draft = fake_pair
    return {s.sample_id: collect_traces(target, draft, s, "MTCP", FixedCaptioner(), max_new_tokens=MAX_NEW) for s in SAMPLES}


def test_fake_samples_cover_eos_and_budget_ends(traces):
    """Both ways a decode ends must occur, or the cut logic would go untested."""
    ended = [t.complete for t in traces.values()]
    assert any(ended) and not all(ended)
    assert all(len(t.output_ids) <= MAX_NEW for t in traces.values())


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_replay_equals_live_exactly(fake_pair, traces, gamma):
    target, draft = fake_pair
    for config in policy_configs():
        config = replace(config, gamma=gamma, max_new_tokens=MAX_NEW)
        for sample in SAMPLES:
            live = speculative_decode(target, draft, [sample], config, captioner=FixedCaptioner())[0]
            replayed = replay(traces[sample.sample_id], config)
            where = f"{config.methods} {config.policy} gamma={gamma} {sample.sample_id}"
            assert replayed.mode == "replay"
            assert replayed.output_ids == live.output_ids, where
            assert replayed.output_text == live.output_text, where
            assert replayed.accepted_per_block == live.accepted_per_block, where
            assert replayed.weights_per_block == live.weights_per_block, where


def test_dynamic_policies_move_the_weights(traces):
    """Guard against a vacuous equality: the dynamic policies must leave uniform weights."""
    config = DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(), gamma=3, max_new_tokens=MAX_NEW)
    weights = [w for t in traces.values() for w in replay(t, config).weights_per_block[1:]]
    assert any(w != [0.25] * 4 for w in weights)
    config = DecodeConfig(methods="MT", policy=GridSearchPolicy(), gamma=3, max_new_tokens=MAX_NEW)
    assert any(w != [0.5, 0.5] for t in traces.values() for w in replay(t, config).weights_per_block)


@pytest.mark.parametrize("budget", [1, 7, 23])
def test_shorter_budget_replays_like_a_shorter_live_run(fake_pair, traces, budget):
    target, draft = fake_pair
    config = DecodeConfig(methods="MTCP", policy=GridSearchPolicy(), gamma=5, max_new_tokens=budget)
    for sample in SAMPLES[:8]:
        live = speculative_decode(target, draft, [sample], config, captioner=FixedCaptioner())[0]
        replayed = replay(traces[sample.sample_id], config)
        assert (replayed.output_ids, replayed.accepted_per_block, replayed.weights_per_block) == (
            live.output_ids, live.accepted_per_block, live.weights_per_block
        )


def test_target_forwards_are_counted(fake_pair, traces):
    target, draft = fake_pair
    sample = SAMPLES[0]
    trace = traces[sample.sample_id]
    # greedy decoding: the prefill gives the first token, then one forward per token; teacher
    # forcing: prefill + one forward
    assert trace.target_forwards == len(trace.output_ids) + 2
    counted = ForwardCounter(target)
    live = speculative_decode(counted, draft, [sample], DecodeConfig(methods="MT", max_new_tokens=MAX_NEW), FixedCaptioner())[0]
    assert counted.forwards == 1 + live.blocks  # prefill, then one verify forward per block


def test_traces_keep_fp32_distributions_per_position(traces):
    trace = next(iter(traces.values()))
    n = len(trace.output_ids)
    assert trace.target_probs.shape[0] == n and trace.draft_probs.shape[:2] == (n, 4)
    assert trace.draft_probs.dtype == torch.float32 and trace.draft_probs.device.type == "cpu"
    assert trace.teacher_forced_disagreements() == []  # chunk-invariant fakes: argmax is y


def test_replay_rejects_sampling(traces):
    with pytest.raises(ValueError, match="greedy"):
        replay(next(iter(traces.values())), DecodeConfig(methods="MT", temperature=0.7))


def test_replay_rejects_untraced_methods(fake_pair):
    target, draft = fake_pair
    trace = collect_traces(target, draft, SAMPLES[0], "MT", max_new_tokens=8)
    with pytest.raises(ValueError, match=r"need \['C'\].*hold only 'MT'"):
        replay(trace, DecodeConfig(methods="MC", max_new_tokens=8))


def test_replay_rejects_a_budget_longer_than_the_traces(fake_pair):
    target, draft = fake_pair
    trace = collect_traces(target, draft, SAMPLES[0], "M", max_new_tokens=3)
    assert not trace.complete
    with pytest.raises(ValueError, match="exceeds the 3 tokens traced"):
        replay(trace, DecodeConfig(methods="M", max_new_tokens=4))


def test_caption_method_needs_a_captioner(fake_pair):
    target, draft = fake_pair
    with pytest.raises(ValueError, match="captioner"):
        collect_traces(target, draft, SAMPLES[0], "MC", max_new_tokens=4)
