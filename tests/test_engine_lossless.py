"""Greedy SD must be token-identical to the target's own greedy `generate` (docs/algorithm.md §1)."""
from __future__ import annotations

import pytest

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.models.loading import load_model
from tests.conftest import FixedCaptioner, solid

MAX_NEW = 32

PROMPTS = [
    ("single", "USER: <image>\nWhat is in this image? ASSISTANT:", [solid((200, 20, 20))]),
    ("multi", "USER: Source: <image> Target: <image> Explain the difference. ASSISTANT:",
     [solid((20, 20, 200)), solid((20, 200, 20), size=(40, 70))]),
    ("long", "USER: <image>\nPlease describe the picture in detail, the colour and the shape, "
             "left and right, top and bottom. ASSISTANT:", [solid((230, 230, 20))]),
]

CONFIGS = {
    "M": DecodeConfig(methods="M"),
    "T": DecodeConfig(methods="T"),
    "C": DecodeConfig(methods="C"),
    "P": DecodeConfig(methods="P"),
    "MT": DecodeConfig(methods="MT"),
    "MTCP": DecodeConfig(methods="MTCP"),
    "MT*": DecodeConfig(methods="MT", policy=GridSearchPolicy(measure="hard+soft")),
    "MTCP*": DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(temperature=1.0)),
}


def sample_of(name, prompt, images) -> Sample:
    return Sample("unit", "test", 0, name, prompt, tuple(images))


def reference_greedy(model, sample: Sample, max_new: int) -> list[int]:
    """The target's own `generate`, through its processor: the ground truth SD must reproduce."""
    inputs = model.processor(images=list(sample.pixels()) or None, text=[sample.prompt], return_tensors="pt")
    out = model.model.generate(**inputs, max_new_tokens=max_new, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.fixture(scope="module")
def references(tiny_pair):
    target, _ = tiny_pair
    return {name: reference_greedy(target, sample_of(name, p, imgs), MAX_NEW) for name, p, imgs in PROMPTS}


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p[0] for p in PROMPTS])
@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_greedy_sd_equals_target_generate(tiny_pair, references, config_name, gamma, prompt):
    target, draft = tiny_pair
    name, text, images = prompt
    config = DecodeConfig(**{**CONFIGS[config_name].__dict__, "gamma": gamma, "max_new_tokens": MAX_NEW})
    record = speculative_decode(target, draft, [sample_of(name, text, images)], config, captioner=FixedCaptioner())[0]
    assert record.output_ids == references[name]
    assert sum(a + 1 for a in record.accepted_per_block) >= len(record.output_ids)
    assert all(0 <= a <= gamma for a in record.accepted_per_block)
    assert len(record.weights_per_block) == record.blocks
    assert all(len(w) == len(config.methods) and abs(sum(w) - 1) < 1e-5 for w in record.weights_per_block)


def test_autoregressive_baseline_equals_generate(tiny_pair, references):
    target, _ = tiny_pair
    name, text, images = PROMPTS[1]
    record = autoregressive_decode(target, [sample_of(name, text, images)], max_new_tokens=MAX_NEW)[0]
    assert record.output_ids == references[name]
    assert record.tau == 1.0 and record.mode == "ar"


def test_ensemble_rows_of_different_lengths_really_differ(tiny_pair):
    """The lossless checks above only mean something if the batch rows have different lengths."""
    from pipeline.drafting.methods import method_embeddings

    target, draft = tiny_pair
    _, text, images = PROMPTS[0]
    ids = draft.tokenize_prompt(text)
    lengths = {m: method_embeddings(draft, m, ids, images, ["a red square"]).shape[0] for m in "MTCP"}
    assert len(set(lengths.values())) == 4, lengths


def test_llava_next_target_is_lossless(tiny_dirs, tiny_pair):
    """LLaVA-NeXT goes through its own class (any-resolution features), drafted by a 1.5 draft."""
    next_target = load_model(tiny_dirs["next_target"])
    assert type(next_target.model).__name__ == "LlavaNextForConditionalGeneration"
    _, draft = tiny_pair
    name, text, images = PROMPTS[1]
    sample = sample_of(name, text, images)
    reference = reference_greedy(next_target, sample, MAX_NEW)
    for methods in ("M", "MT"):
        record = speculative_decode(next_target, draft, [sample], DecodeConfig(methods=methods, gamma=3, max_new_tokens=MAX_NEW))[0]
        assert record.output_ids == reference


def test_text_only_prompt_is_lossless(tiny_pair):
    target, draft = tiny_pair
    sample = sample_of("text", "USER: What is the answer to the question? ASSISTANT:", [])
    reference = reference_greedy(target, sample, MAX_NEW)
    record = speculative_decode(target, draft, [sample], DecodeConfig(methods="MT", gamma=4, max_new_tokens=MAX_NEW))[0]
    assert record.output_ids == reference


def test_identical_draft_accepts_every_proposal(tiny_dirs, tiny_pair):
    target, _ = tiny_pair
    same = load_model(tiny_dirs["target"])
    name, text, images = PROMPTS[0]
    gamma = 4
    record = speculative_decode(target, same, [sample_of(name, text, images)], DecodeConfig(methods="M", gamma=gamma, max_new_tokens=MAX_NEW))[0]
    assert record.accepted_per_block[:-1] == [gamma] * (record.blocks - 1)
    assert record.tau > gamma  # only the last block may be cut by max_new_tokens / EOS


def test_max_new_tokens_cut_inside_a_block(tiny_pair, references):
    target, draft = tiny_pair
    name, text, images = PROMPTS[0]
    for limit in (1, 2, 7):
        record = speculative_decode(target, draft, [sample_of(name, text, images)], DecodeConfig(methods="M", gamma=5, max_new_tokens=limit))[0]
        assert record.output_ids == references[name][:limit]
        assert sum(record.accepted_per_block) + record.blocks >= limit


def test_eos_ends_generation(tiny_pair, references):
    """Make a mid-output token the EOS: SD must stop right after it, like `generate` would."""
    target, draft = tiny_pair
    name, text, images = PROMPTS[0]
    ref = references[name]
    stop_at = next(i for i in range(3, len(ref)) if ref[i] not in ref[:i])
    original = target.model.generation_config.eos_token_id
    target.model.generation_config.eos_token_id = ref[stop_at]
    try:
        record = speculative_decode(target, draft, [sample_of(name, text, images)], DecodeConfig(methods="MT", gamma=5, max_new_tokens=MAX_NEW))[0]
    finally:
        target.model.generation_config.eos_token_id = original
    assert record.output_ids == ref[: stop_at + 1]


def test_captions_computed_once_per_image(tiny_pair):
    from pipeline.drafting.captioner import CachedCaptioner

    target, draft = tiny_pair
    inner = FixedCaptioner()
    captioner = CachedCaptioner(inner)
    name, text, images = PROMPTS[1]
    for gamma in (2, 3):
        speculative_decode(target, draft, [sample_of(name, text, images)], DecodeConfig(methods="MC", gamma=gamma, max_new_tokens=8), captioner)[0]
    assert inner.calls == 2  # two distinct images, two runs


def test_timings_recorded(tiny_pair):
    target, draft = tiny_pair
    name, text, images = PROMPTS[0]
    record = speculative_decode(target, draft, [sample_of(name, text, images)], DecodeConfig(methods="MT", max_new_tokens=8))[0]
    assert record.time_prefill_s > 0 and record.time_draft_s > 0 and record.time_verify_s > 0
    assert record.time_total_s == pytest.approx(record.time_prefill_s + record.time_draft_s + record.time_verify_s)
