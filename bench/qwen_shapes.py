"""A Qwen2.5-VL target/draft pair of real shapes (the 7B target, the 3B draft), built in memory in
transformers' own class with arranged random weights, as `bench.real_shapes` builds LLaVA pairs:
every model predicts the successor of the current token by a wide margin, and the draft agrees
with the target on a chosen share of tokens. What a GPU measures on it is what shapes decide:
step times, speedups, and how often bf16 greedy SD parts from AR.

The language models have the published 7B and 3B shapes (GQA, M-RoPE sections 16/24/24, a
152,064-row vocabulary), the vision tower the published 32 windowed blocks. The tokenizer is the
tiny Qwen BPE of the test pairs (its 384 tokens; the other rows of the embeddings and the LM head
are padding, as checkpoints pad theirs), and images go through Qwen's dynamic-resolution image
processor at the tiny pairs' resolution (4 to 16 merged rows per image). `shapes="tiny"` builds
the tiny pairs' shapes the same way, for a CPU.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from bench.real_shapes import arrange_successor, successor_tables
from pipeline.models.qwen_vl import HFQwenVL
from pipeline.models.tiny_families import (
    MERGE, PATCH, QWEN_SPECIAL_TOKENS, published_template, qwen_image_processor, qwen_tokenizer,
)

VOCAB = 152064  # the checkpoints' embedding rows
TEXT = {  # (target, draft)
    "7b": (dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                intermediate_size=18944),
           dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                intermediate_size=11008)),
    "tiny": (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128),
             dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128)),
}
VISION = {
    "7b": dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, window_size=112,
               fullatt_block_indexes=[7, 15, 23, 31]),
    "tiny": dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, window_size=56,
                 fullatt_block_indexes=[1]),
}
MROPE = {"7b": [16, 24, 24], "tiny": [2, 3, 3]}  # half a head's width, split over (time, height, width)


def qwen_config(shapes: str, text: dict, tokenizer: PreTrainedTokenizerFast) -> Qwen2_5_VLConfig:
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    rope = {"rope_type": "default", "mrope_section": MROPE[shapes], "rope_theta": 1e6}
    return Qwen2_5_VLConfig(
        text_config=dict(**text, vocab_size=VOCAB if shapes != "tiny" else len(tokenizer),
                         max_position_embeddings=32768, rope_parameters=rope, bos_token_id=None,
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                         tie_word_embeddings=False),
        vision_config=dict(**VISION[shapes], patch_size=PATCH, spatial_merge_size=MERGE,
                           temporal_patch_size=2, out_hidden_size=text["hidden_size"]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )


def build_qwen_pair(shapes: str, agreement: float, device: torch.device, dtype: torch.dtype,
                    seed: int = 0) -> tuple[HFQwenVL, HFQwenVL]:
    """(target, draft) adapters of `shapes` (7b | tiny) sharing the tokenizer and image processor,
    allocated on `device` in `dtype` directly (a 7B model never passes through host memory)."""
    tokenizer = qwen_tokenizer()
    tokenizer.chat_template = published_template("qwen2_5_vl")  # prompts as the real model's
    processor = SimpleNamespace(image_processor=qwen_image_processor(), tokenizer=tokenizer)
    tables = successor_tables(len(tokenizer), agreement, seed, specials=len(QWEN_SPECIAL_TOKENS))
    pair = []
    for i, (text, successor) in enumerate(zip(TEXT[shapes], tables)):
        config = qwen_config(shapes, text, tokenizer)
        torch.manual_seed(seed + i)
        with torch.device(device):
            model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)
        rows = config.text_config.vocab_size
        arrange_successor(model, torch.cat([successor, successor.new_full((rows - len(successor),), -1)]))
        pair.append(HFQwenVL(model.eval(), processor, f"qwen2_5_vl-{shapes}-{'draft' if i else 'target'}"))
    return pair[0], pair[1]
