"""Model families this tool can drive, keyed by a checkpoint's `config.json` `model_type`.

Each family names the transformers class that loads it; `pipeline.models.loading` builds the
adapter (`pipeline.models.hf.HFLlava`), which asks the class's own `get_image_features` for
each image's feature rows (Qwen2.5-VL: `pipeline.models.qwen_vl.HFQwenVL`, which also places
them at M-RoPE's three coordinates). A multimodal checkpoint of any other type is refused by
name, never driven as a text-only model: its images would silently vanish from the prompt. A plain
causal LM (`AutoModelForCausalLM`) is driven only when the grid marks its pair `text_only`.
Torch-free, so grid files are checked against it before anything loads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Family:
    model_type: str
    title: str
    model_class: str  # a transformers class name, imported when a model loads
    pooling: bool  # drafting method P: one patch grid per image to pool
    examples: str  # hub ids of this family


FAMILIES: dict[str, Family] = {
    family.model_type: family for family in (
        Family("llava", "LLaVA-1.5", "LlavaForConditionalGeneration", True,
               "llava-hf/llava-1.5-7b-hf, llava-hf/llava-1.5-13b-hf"),
        Family("llava_next", "LLaVA-NeXT (1.6), any-resolution tiles", "LlavaNextForConditionalGeneration",
               False, "llava-hf/llava-v1.6-vicuna-7b-hf"),
        Family("llava_onevision", "LLaVA-OneVision, any-resolution tiles",
               "LlavaOnevisionForConditionalGeneration", False, "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"),
        Family("qwen2_5_vl", "Qwen2.5-VL, dynamic resolution, M-RoPE", "Qwen2_5_VLForConditionalGeneration",
               True, "Qwen/Qwen2.5-VL-3B-Instruct, Qwen/Qwen2.5-VL-7B-Instruct"),
        Family("qwen3_vl", "Qwen3-VL, dynamic resolution, M-RoPE, DeepStack",
               "Qwen3VLForConditionalGeneration", True,
               "Qwen/Qwen3-VL-2B-Instruct, Qwen/Qwen3-VL-8B-Instruct"),
        Family("internvl", "InternVL3, tiles folded by pixel shuffle", "InternVLForConditionalGeneration",
               False, "OpenGVLab/InternVL3-1B-hf, OpenGVLab/InternVL3-8B-hf"),
        Family("gemma3", "Gemma 3, sliding-window layers, bidirectional image attention",
               "Gemma3ForConditionalGeneration", True, "google/gemma-3-4b-it, google/gemma-3-27b-it"),
    )
}
TEXT_ONLY = "text"  # the family name of a plain causal LM, allowed per pair with `text_only: true`
# Text-only checkpoints of a multimodal family (model type -> the family): in a pair marked
# `text_only: true` they draft with the methods that need no image features (T, C), in the
# family's prompt format (`pipeline.models.gemma3.HFGemma3Text`).
TEXT_DRAFTS = {"gemma3_text": "gemma3"}
# How a chat family's prompt is rendered (a grid's `prompt_format`; `pipeline.models.chat_models`):
# `model`, its own chat template (the default); `converted`, the pipeline's LLaVA turns in the
# family's markers, by hand. LLaVA-1.5/NeXT and the embedded target read the paper's format in both.
PROMPT_FORMATS = ("model", "converted")
# families with a tiny pair among the `tiny:` models (`pipeline.models.tiny`): `<family>_target`
# and `<family>_draft`
TINY_FAMILIES = ("qwen2_5_vl", "qwen3_vl", "internvl", "gemma3")
# State-space language models (`pipeline.models.recurrent`): drafts only, alone (text drafting)
# or as the language model of a LLaVA checkpoint (image drafting too).
RECURRENT_TYPES = {"mamba": "Mamba", "mamba2": "Mamba2"}
# Attention and state-space layers mixed: neither a KV cache nor a state alone rolls them back.
HYBRID_TYPES = ("jamba", "zamba", "zamba2", "falcon_h1", "nemotron_h", "bamba", "granitemoehybrid",
                "qwen3_next")
# keys of a config.json that only multimodal checkpoints carry
MULTIMODAL_KEYS = ("vision_config", "vision_tower", "mm_vision_tower", "visual", "image_token_id",
                   "image_token_index")


class UnsupportedFamily(ValueError):
    """A checkpoint this tool cannot drive faithfully; the message names it and what is supported."""


def is_multimodal(config: Mapping[str, Any]) -> bool:
    return any(key in config for key in MULTIMODAL_KEYS)


def supported_text() -> str:
    return ", ".join(f"{f.model_type} ({f.title})" for f in FAMILIES.values())


def language_model_type(config: Mapping[str, Any]) -> str:
    """The `model_type` of a checkpoint's language model (its `text_config`'s for a LLaVA one)."""
    text = config.get("text_config")
    return str((text if isinstance(text, Mapping) else config).get("model_type", "?"))


def is_recurrent_config(config: Mapping[str, Any]) -> bool:
    return language_model_type(config) in RECURRENT_TYPES


def check_role(config: Mapping[str, Any], name: str, role: str) -> None:
    """A checkpoint's config in a pair: a hybrid is refused in either role, a state-space model
    as a target (`drafts_only`)."""
    text_type = language_model_type(config)
    if text_type in HYBRID_TYPES:
        raise UnsupportedFamily(f"{name}: {text_type!r} mixes attention and state-space layers, which "
                                "this engine cannot roll back; use an attention model or a pure "
                                "Mamba/Mamba2 draft")
    drafts_only(name, role, recurrent=text_type in RECURRENT_TYPES)


def drafts_only(name: str, role: str, *, recurrent: bool) -> None:
    """The one rule for state-space models: they only draft. As a target one would have to
    read a token tree, or gamma + 1 tokens, in one forward."""
    if role == "target" and recurrent:
        raise UnsupportedFamily(f"{name}: a state-space model can only be a draft: verifying needs a target "
                                "that reads many tokens, or a token tree, in one forward")


def check_family(config: Mapping[str, Any], name: str, *, allow_text: bool) -> str:
    """The family of a checkpoint's config: a FAMILIES key, or TEXT_ONLY where the grid
    allows it; UnsupportedFamily otherwise."""
    model_type = config.get("model_type", "?")
    if model_type in FAMILIES:
        return model_type
    if is_multimodal(config):
        raise UnsupportedFamily(f"{name}: model_type {model_type!r} is a multimodal family this tool does "
                                f"not drive; supported: {supported_text()}")
    if not allow_text:
        raise UnsupportedFamily(f"{name}: model_type {model_type!r} is a text-only model; mark its pair "
                                "`text_only: true` to run it on prompts without images, or use a supported "
                                f"multimodal family: {supported_text()}")
    return TEXT_ONLY
