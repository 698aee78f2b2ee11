"""A model's own transformers `generate` on a sample, fed what its processor would write: the
reference our decodes are checked against (tests) and timed beside (the GPU check).

The processors of some families cannot be built here (they also want a video processor, which
needs torchvision), so the inputs are built from the parts the adapter holds: each image
placeholder is expanded to as many image tokens as the model's features have rows, and the
pixels come from its image processor.
"""
from __future__ import annotations

import torch

from pipeline.data.sample import Sample
from pipeline.models.hf import HFModel


def generate_inputs(model: HFModel, sample: Sample) -> dict[str, torch.Tensor]:
    """`generate`'s keyword inputs for `sample` (one request), on the model's device."""
    features = model.image_features(sample.pixels())
    ids, k = [], 0
    for token in model.tokenize_prompt(sample.prompt):
        count = features[k].shape[0] if token == model.image_token_id else 1
        k += token == model.image_token_id
        ids += [token] * count
    inputs = {}
    if sample.images:  # a text-only prompt has no pixels: the image processor is not called
        batch = [list(sample.pixels())] if model.family == "llava_onevision" else list(sample.pixels())
        inputs = dict(model.processor.image_processor(batch, return_tensors="pt"))
        inputs.pop("num_patches", None)  # InternVL's processor splits its tiles by it, and passes on none
        inputs.pop("num_crops", None)  # Gemma 3's pan-and-scan crop counts (none here), not a model input
    input_ids = torch.tensor([ids])
    if model.family in ("qwen2_5_vl", "qwen3_vl"):  # their processors mark image tokens; M-RoPE reads them
        inputs["mm_token_type_ids"] = (input_ids == model.image_token_id).int()
    if model.family == "gemma3":  # its processor marks them too: they attend to each other both ways
        inputs["token_type_ids"] = (input_ids == model.image_token_id).long()
    inputs |= {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    inputs = {name: value.to(model.device) for name, value in inputs.items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    return inputs


def reference_greedy(model: HFModel, inputs: dict[str, torch.Tensor], max_new: int, **extra) -> list[int]:
    """The token ids transformers' greedy `generate` adds to `inputs` (`generate_inputs`);
    `extra`: more of its options (an `assistant_model`, a cache implementation)."""
    out = model.model.generate(**inputs, max_new_tokens=max_new, do_sample=False, **extra)
    return out[0, inputs["input_ids"].shape[1]:].tolist()
