"""Tiny random-weight models of the ChatML families in their real transformers classes, for tests
and the smoke grid: Qwen2.5-VL, Qwen3-VL, InternVL3 and Gemma 3.

- Qwen2.5-VL: a two-block vision tower (patch 14, 2x2 merge: a 56x56 image is 2x2 merged rows,
  an 84x112 one 3x4) and a two-layer language model with M-RoPE (`mrope_section` over a 16-wide
  head).
- Qwen3-VL: the same with 16-px patches (32-px merged rows), interleaved M-RoPE, three decoder
  layers, and DeepStack features from both vision blocks added after the first two, grown so
  that a prompt path that drops them decodes differently (without them, our AR and transformers'
  `generate` part on the per-family test prompts).
- InternVL3: a two-layer InternViT-style tower on 56-pixel tiles (CLS dropped, pixel shuffle
  0.5: 4 rows per tile; a 112x56 image is 2 tiles and a thumbnail) over a two-layer Qwen2.
Each draft is its target with seeded noise on every weight, as for the LLaVA pairs
(`pipeline.models.tiny`). Tokenizers are the tiny BPE with the family's ChatML and image special
tokens. The full processors also want a video processor, which needs torchvision (not
installed here): the image processor and the tokenizer are saved side by side, and loading
uses them as the processor's two parts.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from pipeline.models.tiny_common import (
    ProcessorConfig, SavedSeparately, perturbed_copy, silence_special_tokens, trained_bpe,
)

QWEN_SPECIAL_TOKENS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                       "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
MERGE = 2  # 2x2 patches merged into one row of the language model's input
PATCH = 14
QWEN3_PATCH = 16
DEEPSTACK_GAIN = 100.0  # DeepStack features 100x their random size (checked: dropping them changes outputs)


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
    return silence_special_tokens(Qwen2_5_VLForConditionalGeneration(config).eval(), tokenizer,
                                  QWEN_SPECIAL_TOKENS)


def build_qwen3_vl(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Qwen3VLForConditionalGeneration:
    """Qwen3-VL's class: 16-px patches merged 2x2 (32-px rows), DeepStack features from both
    vision blocks added after the first two of three decoder layers, interleaved M-RoPE."""
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN_SPECIAL_TOKENS}
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                initializer_range=0.3, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                        "mrope_interleaved": True, "rope_theta": 10000.0},
                bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                tie_word_embeddings=False)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=QWEN3_PATCH,
                  spatial_merge_size=MERGE, temporal_patch_size=2, out_hidden_size=64,
                  num_position_embeddings=64, deepstack_visual_indexes=[0, 1])
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    visual = model.model.visual
    with torch.no_grad():  # random DeepStack features barely move a random model: grown, a prompt
        for merger in visual.deepstack_merger_list:  # path that drops them decodes otherwise
            merger.linear_fc2.weight.mul_(DEEPSTACK_GAIN)
    return silence_special_tokens(model, tokenizer, QWEN_SPECIAL_TOKENS)


def qwen_image_processor(patch: int = PATCH) -> Qwen2VLImageProcessorPil:
    """Dynamic resolution between 4 and 16 merged rows per image, so the tiny images keep their
    aspect: a 60x40 image is 2x3 rows, two images of different sizes different counts."""
    unit = (patch * MERGE) ** 2
    return Qwen2VLImageProcessorPil(min_pixels=4 * unit, max_pixels=16 * unit, patch_size=patch,
                                    merge_size=MERGE, temporal_patch_size=2)


def published_template(family: str) -> str:
    """The family's published chat template (`pipeline/assets/chat_templates`), byte for byte."""
    return (files("pipeline.assets.chat_templates") / f"{family}.jinja").read_text()


def _saved_processor(tokenizer: PreTrainedTokenizerFast, model) -> SavedSeparately:
    tokenizer.chat_template = published_template(model.config.model_type)
    return SavedSeparately(qwen_image_processor(model.config.vision_config.patch_size), tokenizer)



INTERNVL_SPECIAL_TOKENS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>",
                           "<IMG_CONTEXT>", "<video>"]
INTERNVL_TILE = 56  # 4x4 patches of 14 px per tile, folded 2x2: 4 rows per tile


def internvl_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny BPE as an InternVL tokenizer (its processor reads the image tokens' names from it)."""
    names = {"start_image_token": "<img>", "end_image_token": "</img>",
             "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}
    return PreTrainedTokenizerFast(tokenizer_object=trained_bpe(INTERNVL_SPECIAL_TOKENS),
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="<unk>",
                                   extra_special_tokens=names)


def build_internvl(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> InternVLForConditionalGeneration:
    """InternVL3's class: an InternViT-style tower (CLS dropped, pixel shuffle 0.5) over a Qwen2 model."""
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in INTERNVL_SPECIAL_TOKENS}
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  image_size=[INTERNVL_TILE, INTERNVL_TILE], patch_size=[PATCH, PATCH])
    text = dict(model_type="qwen2", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=4096, initializer_range=0.3, bos_token_id=None,
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=False)
    config = InternVLConfig(vision_config=vision, text_config=text, image_token_id=ids["<IMG_CONTEXT>"],
                            image_seq_length=4, downsample_ratio=0.5, vision_feature_layer=-1,
                            vision_feature_select_strategy="default", tie_word_embeddings=False)
    torch.manual_seed(seed)
    return silence_special_tokens(InternVLForConditionalGeneration(config).eval(), tokenizer,
                                  INTERNVL_SPECIAL_TOKENS)


def _internvl_processor(tokenizer: PreTrainedTokenizerFast, model) -> SavedSeparately:
    """Tiles of 56 px, up to 4 per image plus the thumbnail (a 112x56 image: 2 tiles + 1)."""
    image_processor = GotOcr2ImageProcessorPil(size={"height": INTERNVL_TILE, "width": INTERNVL_TILE},
                                               crop_to_patches=True, min_patches=1, max_patches=4)
    tokenizer.chat_template = published_template("internvl")
    # its processor wants a video processor (torchvision) to be built: its config is written alone
    config = ProcessorConfig({"processor_class": "InternVLProcessor", "image_seq_length": 4})
    return SavedSeparately(image_processor, tokenizer, config)




GEMMA_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                        "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
GEMMA_WINDOW = 8  # positions a sliding layer sees: far fewer than a prompt, so the window matters


def gemma_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny BPE as a Gemma 3 tokenizer: `<end_of_turn>` ends the answer."""
    names = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
             "image_token": "<image_soft_token>"}
    return PreTrainedTokenizerFast(tokenizer_object=trained_bpe(GEMMA_SPECIAL_TOKENS), bos_token="<bos>",
                                   eos_token="<end_of_turn>", pad_token="<pad>", unk_token="<unk>",
                                   extra_special_tokens=names)


def build_gemma3(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Gemma3ForConditionalGeneration:
    """Gemma 3's class: two sliding-window layers (window 8) and a full one, a SigLIP tower on
    56-px images (4x4 patches) pooled to 2x2 = 4 rows per image."""
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in GEMMA_SPECIAL_TOKENS}
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                sliding_window=GEMMA_WINDOW,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                max_position_embeddings=4096, initializer_range=0.3, pad_token_id=ids["<pad>"],
                eos_token_id=ids["<end_of_turn>"], bos_token_id=ids["<bos>"], tie_word_embeddings=False)
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=PATCH,
                  vision_use_head=False)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          boi_token_index=ids["<start_of_image>"], eoi_token_index=ids["<end_of_image>"],
                          image_token_index=ids["<image_soft_token>"], tie_word_embeddings=False)
    torch.manual_seed(seed)
    return silence_special_tokens(Gemma3ForConditionalGeneration(config).eval(), tokenizer,
                                  GEMMA_SPECIAL_TOKENS)


def _gemma_processor(tokenizer: PreTrainedTokenizerFast, model) -> Gemma3Processor:
    """Gemma 3's own processor (it needs no video processor), saved with its image token count,
    so `AutoProcessor` on the folder expands an image to the 4 rows the model makes, not 256."""
    return Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 56, "width": 56}),
                           tokenizer=tokenizer, image_seq_length=model.config.mm_tokens_per_image,
                           chat_template=published_template("gemma3"))


CHAT_FAMILY_BUILDERS = {  # model_type -> (tokenizer builder, model builder, processor builder)
    "qwen2_5_vl": (qwen_tokenizer, build_qwen2_5_vl, _saved_processor),
    "qwen3_vl": (qwen_tokenizer, build_qwen3_vl, _saved_processor),
    "internvl": (internvl_tokenizer, build_internvl, _internvl_processor),
    "gemma3": (gemma_tokenizer, build_gemma3, _gemma_processor),
}


def build_gemma3_text_draft(target_dir: Path, out_dir: Path, noise: float = 0.02, seed: int = 2) -> None:
    """A text-only Gemma 3 (`Gemma3ForCausalLM`, like `gemma-3-1b-it`) made of the tiny target's
    language model with seeded noise, and the target's tokenizer: it drafts T and C for it."""
    target = Gemma3ForConditionalGeneration.from_pretrained(target_dir)
    draft = Gemma3ForCausalLM(target.config.text_config).eval()
    draft.model.load_state_dict(target.model.language_model.state_dict())
    draft.lm_head.load_state_dict(target.lm_head.state_dict())
    perturbed_copy(draft, noise=noise, seed=seed).save_pretrained(out_dir)
    PreTrainedTokenizerFast.from_pretrained(target_dir).save_pretrained(out_dir)
