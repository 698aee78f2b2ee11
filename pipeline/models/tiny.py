"""Tiny random-weight LLaVA models built locally, for tests and the smoke grid (no downloads).

`python -m pipeline.models.tiny OUT_DIR` writes OUT_DIR/target, OUT_DIR/draft (LLaVA-1.5 class),
OUT_DIR/next_target (LLaVA-NeXT class), and OUT_DIR/bigram_target with OUT_DIR/mamba_draft and
OUT_DIR/mamba2_draft (LLaVA with a state-space language model, `pipeline.models.tiny_ssm`), and
OUT_DIR/<family>_target with OUT_DIR/<family>_draft for Qwen2.5-VL, Qwen3-VL, InternVL3 and
Gemma 3, and OUT_DIR/gemma3_text_draft, a text-only Gemma 3 (`pipeline.models.tiny_families`), all
loadable by `from_pretrained`; head drafts of every kind for the bigram target
(OUT_DIR/<kind>_head) and for each family made a bigram target (OUT_DIR/<family>_bigram_target,
OUT_DIR/<family>_<kind>_head), in their reference code's layouts (`pipeline.models.tiny_heads`).
The draft is the target with seeded noise on every weight, so it agrees with the target often
but not always —
the regime where speculative decoding has something to measure. `build_family_pair` writes a
target and draft of any supported family (`pipeline.models.families`), for the per-family tests.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tokenizers import Tokenizer, processors
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessorPil,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

from pipeline.models.families import TINY_FAMILIES
from pipeline.models.head_names import HEAD_KINDS
from pipeline.models.tiny_common import (
    SavedSeparately, perturbed_copy, silence_special_tokens, trained_bpe,
)
from pipeline.models.tiny_families import CHAT_FAMILY_BUILDERS, build_gemma3_text_draft

IMAGE_SIZE = 56  # 4x4 patches of 14 px: 16 image tokens, 4 after 2x2 pooling
PATCH_SIZE = 14
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]


def build_tokenizer(vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a fixed word list: deterministic, with BOS added and
    `<image>` as one special token, like LLaVA's tokenizer."""
    return llava_tokenizer(trained_bpe(SPECIAL_TOKENS, vocab_size))


def llava_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """A `tokenizers` model with `SPECIAL_TOKENS` as a LLaVA-style tokenizer: BOS added,
    `<image>` as the image token."""
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )


def _text_config(tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.3,  # peaked next-token distributions, so greedy outputs are stable
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def _vision_config() -> CLIPVisionConfig:
    return CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=32,
    )


ANYRES_PINPOINTS = [[IMAGE_SIZE, IMAGE_SIZE], [IMAGE_SIZE, 2 * IMAGE_SIZE], [2 * IMAGE_SIZE, IMAGE_SIZE]]


def _build(config_class, model_class, tokenizer: PreTrainedTokenizerFast, seed: int, **family_fields):
    """A tiny model of one LLaVA family: the shared CLIP tower and Llama text model, seeded.
    The CLS-dropping `default` feature strategy everywhere: CLIP has a CLS token (OneVision's
    real SigLIP tower has none, and uses `full`)."""
    torch.manual_seed(seed)
    config = config_class(
        vision_config=_vision_config(),
        text_config=_text_config(tokenizer),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        **family_fields,
    )
    return silence_special_tokens(model_class(config).eval(), tokenizer, SPECIAL_TOKENS)


def build_llava(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlavaForConditionalGeneration:
    return _build(LlavaConfig, LlavaForConditionalGeneration, tokenizer, seed)


def build_llava_next(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> LlavaNextForConditionalGeneration:
    return _build(LlavaNextConfig, LlavaNextForConditionalGeneration, tokenizer, seed,
                  image_grid_pinpoints=ANYRES_PINPOINTS)


def build_llava_onevision(tokenizer: PreTrainedTokenizerFast,
                          seed: int = 0) -> LlavaOnevisionForConditionalGeneration:
    return _build(LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, tokenizer, seed,
                  image_grid_pinpoints=ANYRES_PINPOINTS)


def _llava_onevision_processor(tokenizer: PreTrainedTokenizerFast,
                               model: LlavaOnevisionForConditionalGeneration) -> SavedSeparately:
    image_processor = LlavaOnevisionImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_grid_pinpoints=model.config.image_grid_pinpoints,
    )
    return SavedSeparately(image_processor, tokenizer)


FAMILY_BUILDERS = {  # model_type -> (tokenizer builder, model builder, processor builder)
    "llava": (build_tokenizer, build_llava, lambda tokenizer, model: llava_processor(tokenizer)),
    "llava_next": (build_tokenizer, build_llava_next,
                   lambda tokenizer, model: _llava_next_processor(tokenizer, model)),
    "llava_onevision": (build_tokenizer, build_llava_onevision, _llava_onevision_processor),
}


def family_builders() -> dict:
    """`FAMILY_BUILDERS` and the other families' (`pipeline.models.tiny_families`)."""
    return {**FAMILY_BUILDERS, **CHAT_FAMILY_BUILDERS}


def build_family_pair(family: str, out_dir: str | Path, noise: float = 0.02,
                      names: tuple[str, str] = ("target", "draft")) -> tuple[Path, Path]:
    """A tiny target of `family` and its perturbed draft under `out_dir` as `names`; their dirs."""
    build_tokenizer_of, build_model, build_processor = family_builders()[family]
    tokenizer = build_tokenizer_of()
    target = build_model(tokenizer, seed=0)
    out = Path(out_dir)
    for name, model in zip(names, (target, perturbed_copy(target, noise=noise, seed=1))):
        model.save_pretrained(out / name)
        build_processor(tokenizer, model).save_pretrained(out / name)
    return out / names[0], out / names[1]


def llava_processor(
    tokenizer: PreTrainedTokenizerFast, image_size: int = IMAGE_SIZE, patch_size: int = PATCH_SIZE
) -> LlavaProcessor:
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )


def _llava_next_processor(tokenizer: PreTrainedTokenizerFast,
                          model: LlavaNextForConditionalGeneration) -> LlavaNextProcessor:
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_grid_pinpoints=model.config.image_grid_pinpoints,
    )
    return LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )


def build_tiny_pair(out_dir: str | Path, noise: float = 0.02) -> tuple[Path, Path]:
    """Write tiny target, draft, LLaVA-NeXT target, the bigram target with the Mamba and
    Mamba2 drafts and the EAGLE head that follow it (`pipeline.models.tiny_ssm`,
    `pipeline.models.tiny_heads`), and a target and draft of each of
    `TINY_FAMILIES` under `out_dir`; return (target, draft) dirs."""
    from pipeline.models.tiny_heads import (
        build_eagle3_head, build_eagle_head, build_family_heads, build_medusa_head, build_vispec_head,
    )
    from pipeline.models.tiny_ssm import KINDS, build_ssm_draft, make_bigram_target

    out = Path(out_dir)
    tokenizer = build_tokenizer()
    target = build_llava(tokenizer, seed=0)
    draft = perturbed_copy(target, noise=noise, seed=1)
    next_target = build_llava_next(tokenizer, seed=2)
    models = [("target", target, llava_processor(tokenizer)), ("draft", draft, llava_processor(tokenizer)),
              ("next_target", next_target, _llava_next_processor(tokenizer, next_target))]
    bigram_target = make_bigram_target(build_llava(tokenizer, seed=4), tokenizer)
    models.append(("bigram_target", bigram_target, llava_processor(tokenizer)))
    models += [(f"{kind}_draft", build_ssm_draft(kind, tokenizer, bigram_target), llava_processor(tokenizer))
               for kind in KINDS]
    for name, model, processor in models:
        model.save_pretrained(out / name)
        processor.save_pretrained(out / name)
    build_eagle_head(bigram_target, out / "eagle_head")  # in their reference code's layouts: no processor
    build_eagle3_head(bigram_target, tokenizer, out / "eagle3_head")
    build_eagle_head(bigram_target, out / "msd_head", seed=8)  # MSD's files are EAGLE's
    build_medusa_head(bigram_target, tokenizer, out / "medusa_head")
    build_vispec_head(bigram_target, out / "vispec_head")
    for family in TINY_FAMILIES:
        build_family_pair(family, out, noise=noise, names=(f"{family}_target", f"{family}_draft"))
        build_family_heads(out, family)
    build_gemma3_text_draft(out / "gemma3_target", out / "gemma3_text_draft", noise=noise)
    return out / "target", out / "draft"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write the tiny models into (target/, draft/, ...)")
    parser.add_argument("--noise", type=float, default=0.02, help="relative weight noise of the draft")
    args = parser.parse_args()
    target, draft = build_tiny_pair(args.out_dir, noise=args.noise)
    for name in ("target", "draft", "next_target", "bigram_target", "mamba_draft", "mamba2_draft",
                 "eagle_head", "eagle3_head", "msd_head", "medusa_head", "vispec_head",
                 *(f"{family}_{role}" for family in TINY_FAMILIES
                   for role in ("target", "draft", "bigram_target")),
                 *(f"{family}_{kind}_head" for family in TINY_FAMILIES for kind in HEAD_KINDS),
                 "gemma3_text_draft"):
        print(f"{name}={Path(args.out_dir) / name}")


if __name__ == "__main__":
    main()
