"""Every supported model family is lossless on a tiny model built from its config; any other
multimodal family is refused by name, and a text-only model runs only where the grid says so."""
from __future__ import annotations

import json

import pytest

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.drafting.policies import GridSearchPolicy
from pipeline.models.families import FAMILIES
from pipeline.models.loading import ModelLoadError, load_model
from pipeline.models.reference import generate_inputs, reference_greedy
from pipeline.models.tiny import build_family_pair
from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import parse_grid
from tests.conftest import solid

MAX_NEW = 24
PROMPTS = {
    "single": ("USER: <image>\nWhat is in this image? ASSISTANT:", (solid((200, 20, 20), size=(60, 40)),)),
    "multi": ("USER: Source: <image> Target: <image> Explain the difference. ASSISTANT:",
              (solid((20, 20, 200)), solid((20, 200, 20), size=(40, 70)))),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_pair(request, tmp_path_factory):
    target_dir, draft_dir = build_family_pair(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, load_model(str(target_dir)), load_model(str(draft_dir))


def hf_greedy(model, sample: Sample, max_new: int) -> list[int]:
    """The target's own `generate` on `sample`."""
    return reference_greedy(model, generate_inputs(model, sample), max_new)


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_each_family_is_lossless(family_pair, prompt):
    family, target, draft = family_pair
    assert type(target.model).__name__ == FAMILIES[family].model_class
    text, images = PROMPTS[prompt]
    sample = Sample("unit", "test", 0, prompt, text, images)
    reference = hf_greedy(target, sample, MAX_NEW)
    assert autoregressive_decode(target, [sample], max_new_tokens=MAX_NEW)[0].output_ids == reference
    methods = ["M", "T", "MT"] + (["P", "MTP"] if FAMILIES[family].pooling else [])
    for name in methods:
        record = speculative_decode(target, draft, [sample], DecodeConfig(methods=name, gamma=3, max_new_tokens=MAX_NEW))[0]
        assert record.output_ids == reference, name
    star = DecodeConfig(methods="MT", policy=GridSearchPolicy(), gamma=3, max_new_tokens=MAX_NEW)
    assert speculative_decode(target, draft, [sample], star)[0].output_ids == reference


def test_each_family_reads_a_text_only_prompt_as_generate_does(family_pair):
    """The reference helper builds a prompt with no image for every family; our AR and SD equal it."""
    _, target, draft = family_pair
    sample = Sample("unit", "test", 0, "first", "USER: What colour is a ripe banana? ASSISTANT:", ())
    reference = hf_greedy(target, sample, MAX_NEW)
    assert autoregressive_decode(target, [sample], max_new_tokens=MAX_NEW)[0].output_ids == reference
    config = DecodeConfig(methods="M", gamma=3, max_new_tokens=MAX_NEW)
    assert speculative_decode(target, draft, [sample], config)[0].output_ids == reference


def fake_checkpoint(path, config: dict):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def grid_with(target: str, **pair) -> dict:
    return {"name": "g", "datasets": ["embedded_vqa"], "methods": ["M"], "pairs": [{"target": target, "draft": target, **pair}]}


def test_an_unsupported_multimodal_family_is_refused_by_name(tmp_path):
    qwen = fake_checkpoint(tmp_path / "qwen", {"model_type": "qwen2_vl", "vision_config": {"depth": 2}})  # not 2.5
    with pytest.raises(GridError, match=r"pairs\[0\]\.target: .*qwen2_vl.* multimodal family .*supported: llava"):
        parse_grid(grid_with(qwen))
    with pytest.raises(GridError, match="qwen2_vl"):
        parse_grid(grid_with(qwen, text_only=True))  # never driven as text, even when asked
    with pytest.raises(ModelLoadError, match="qwen2_vl.*supported"):
        load_model(qwen)


def test_a_text_only_model_needs_the_pair_to_say_so(tmp_path):
    llama = fake_checkpoint(tmp_path / "llama", {"model_type": "llama", "vocab_size": 10})
    with pytest.raises(GridError, match=r"text-only model; mark its pair `text_only: true`"):
        parse_grid(grid_with(llama))
    spec = parse_grid(grid_with(llama, text_only=True))
    assert spec.text_only == spec.pairs


def test_the_tiny_gemma3_folder_writes_its_processor(tiny_dirs):
    """`AutoProcessor` on the tiny Gemma 3 expands an image to the rows the model makes (4), not
    the processor's default 256."""
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_dirs["gemma3_target"])
    ids = processor(text="<start_of_image> a square", images=[solid((200, 20, 20))], return_tensors="pt")["input_ids"]
    rows = int((ids == processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")).sum())
    assert type(processor).__name__ == "Gemma3Processor"
    assert rows == AutoConfig.from_pretrained(tiny_dirs["gemma3_target"]).mm_tokens_per_image == 4
