"""Prompts in each family's own chat template: the tiny Qwen2.5-VL, Qwen3-VL, InternVL3 and Gemma 3
carry their published templates (pinned by hash), and our prompt ids, images expanded, equal what
the family's own processor makes of the same messages (`apply_chat_template`, then the processor
on the text and images) for one image, two and none; transformers' `generate` on the processor's
inputs gives our AR output. `prompt_format: converted` keeps the pipeline's own turns."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer
from transformers.processing_utils import ProcessorMixin

from pipeline.data.sample import Sample
from pipeline.decoding.loop import autoregressive_decode
from pipeline.models.loading import load_model
from pipeline.models.reference import generate_inputs
from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import parse_grid
from tests.conftest import solid

MAX_NEW = 16
TEMPLATES = Path(__file__).resolve().parents[1] / "pipeline" / "assets" / "chat_templates"
PUBLISHED = {  # sha256 of each file: the published template, byte for byte
    "qwen2_5_vl": "a0bc6f6fc7a29a80017a433e8f03a1cc1236e838a944a2d034295a60c4f2fddb",
    "qwen3_vl": "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4",
    "internvl": "b3e3fa7cdeceec1d3dfe0d17b77724baf3857714e688f3a700261567e96140eb",
    "gemma3": "7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4",
}
RED, BLUE = solid((200, 20, 20), size=(60, 40)), solid((20, 20, 200), size=(112, 56))
# (our prompt, the messages a user hands the processor, the images)
PROMPTS = {
    "one image": ("USER: <image>\nWhat is in this image? ASSISTANT:",
                  [{"type": "image"}, {"type": "text", "text": "What is in this image?"}], [RED]),
    "two images": ("USER: Source: <image> Target: <image> Explain the difference. ASSISTANT:",
                   [{"type": "text", "text": "Source:"}, {"type": "image"}, {"type": "text", "text": "Target:"},
                    {"type": "image"}, {"type": "text", "text": "Explain the difference."}], [RED, BLUE]),
    "text only": ("USER: What colour is a ripe banana? ASSISTANT:",
                  [{"type": "text", "text": "What colour is a ripe banana?"}], []),
}
PROCESSORS = {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor", "internvl": "InternVLProcessor"}


def test_the_templates_are_the_published_ones():
    for family, digest in PUBLISHED.items():
        assert hashlib.sha256((TEMPLATES / f"{family}.jinja").read_bytes()).hexdigest() == digest, family


def own_processor(folder: str, family: str, monkeypatch) -> ProcessorMixin:
    """The family's processor class on the folder's parts. Qwen's and InternVL's also want a video
    processor, which needs torchvision (not installed here): built without one, the class's check
    of that part skipped; images and text go through the class's own code."""
    if family == "gemma3":
        return AutoProcessor.from_pretrained(folder)
    import transformers

    check = ProcessorMixin.check_argument_for_proper_class
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class",
                        lambda self, name, arg: None if name == "video_processor" else check(self, name, arg))
    config = Path(folder, "processor_config.json")
    extra = {k: v for k, v in json.loads(config.read_text()).items() if k != "processor_class"} if config.exists() else {}
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return getattr(transformers, PROCESSORS[family])(
        image_processor=AutoImageProcessor.from_pretrained(folder), tokenizer=tokenizer, video_processor=None,
        chat_template=tokenizer.chat_template, **extra)


@pytest.mark.parametrize("family", list(PUBLISHED))
def test_our_prompts_are_the_processors(tiny_dirs, family, monkeypatch):
    folder = tiny_dirs[f"{family}_target"]
    model, processor = load_model(folder), own_processor(folder, family, monkeypatch)
    assert processor.chat_template == (TEMPLATES / f"{family}.jinja").read_text()
    for name, (prompt, content, images) in PROMPTS.items():
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
        theirs = dict(processor(text=[text], images=images or None, return_tensors="pt"))
        sample = Sample("unit", "test", 0, "first", prompt, tuple(images))
        ours = generate_inputs(model, sample)["input_ids"]
        assert ours.tolist() == theirs["input_ids"].tolist(), (family, name)
        for part in ("num_patches", "num_crops"):  # counts of tiles and crops, not model inputs
            theirs.pop(part, None)
        generated = model.model.generate(**theirs, max_new_tokens=MAX_NEW, do_sample=False)
        ar = autoregressive_decode(model, [sample], max_new_tokens=MAX_NEW)[0].output_ids
        assert generated[0, ours.shape[1]:].tolist() == ar, (family, name)


def test_converted_prompts_keep_the_pipelines_turns(tiny_dirs):
    """`converted`: no default system turn and LLaVA's newline after the image, as before."""
    model = load_model(tiny_dirs["qwen2_5_vl_target"])
    prompt = "USER: <image>\nWhat is in this image? ASSISTANT:"
    assert model.chat_text(prompt).startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")
    model.prompt_format = "converted"
    assert model.chat_text(prompt) == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>\n"
                                       "What is in this image?<|im_end|>\n<|im_start|>assistant\n")


def test_the_prompt_format_is_a_grid_value_in_the_key():
    grid = {"datasets": ["embedded_vqa"], "methods": ["AR", "M"],
            "pairs": [{"target": "tiny:qwen2_5_vl_target", "draft": "tiny:qwen2_5_vl_draft"}]}
    model, converted = parse_grid(grid), parse_grid({**grid, "prompt_format": "converted"})
    assert {c.prompt_format for c in converted.configs()} == {"converted"}
    keys = lambda spec: {c.key() for c in spec.configs()}
    assert not keys(model) & keys(converted)  # another prompt: other rows
    with pytest.raises(GridError, match=r"prompt_format.*'chatml'.*model.*converted"):
        parse_grid({**grid, "prompt_format": "chatml"})
