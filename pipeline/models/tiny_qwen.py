"""Tiny random-weight Qwen2.5-VL models in the real transformers classes, for tests and the smoke grid.

The target is a `Qwen2_5_VLForConditionalGeneration` with a two-block vision tower (patch 14,
2x2 merge: a 56x56 image is a 2x2 grid of merged rows, a 60x40 one 2x3) and a two-layer language
model with M-RoPE (`mrope_section` over a 16-wide head); the draft is the target with seeded
noise on every weight, as for the LLaVA pairs (`pipeline.models.tiny`). The tokenizer is the
tiny BPE with Qwen's ChatML and vision special tokens. The full `Qwen2_5_VLProcessor` also wants
a video processor, which needs torchvision (not installed here): the image processor and the
tokenizer are saved side by side, and loading uses them as the processor's two parts.
"""
from __future__ import annotations

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from pipeline.models.tiny_common import SavedSeparately, trained_bpe

QWEN_SPECIAL_TOKENS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                       "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
MERGE = 2  # 2x2 patches merged into one row of the language model's input
PATCH = 14


def qwen_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny BPE as a Qwen tokenizer: no BOS, `<|im_end|>` ends a turn and the answer."""
    return PreTrainedTokenizerFast(tokenizer_object=trained_bpe(QWEN_SPECIAL_TOKENS), eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<unk>")


def build_qwen2_5_vl(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen2_5_VLForConditionalGeneration:
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                initializer_range=0.3,  # peaked next-token distributions, as the tiny LLaVAs
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
                bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                tie_word_embeddings=False)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=PATCH,
                  spatial_merge_size=MERGE, temporal_patch_size=2, window_size=56, out_hidden_size=64,
                  fullatt_block_indexes=[1])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"],
                              vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    silent = [ids[token] for token in QWEN_SPECIAL_TOKENS if token != "<|im_end|>"]
    with torch.no_grad():  # a random model never emits an image or turn token (a real one does not)
        model.lm_head.weight[silent] = 0
    return model


def qwen_image_processor() -> Qwen2VLImageProcessorPil:
    """Dynamic resolution between 4 and 16 merged rows per image, so the tiny images keep their
    aspect: a 60x40 image is 2x3 rows, two images of different sizes different counts."""
    unit = (PATCH * MERGE) ** 2
    return Qwen2VLImageProcessorPil(min_pixels=4 * unit, max_pixels=16 * unit, patch_size=PATCH,
                                    merge_size=MERGE, temporal_patch_size=2)


def _saved_processor(tokenizer: PreTrainedTokenizerFast, model) -> SavedSeparately:
    return SavedSeparately(qwen_image_processor(), tokenizer)


QWEN_BUILDERS = {"qwen2_5_vl": (qwen_tokenizer, build_qwen2_5_vl, _saved_processor)}
