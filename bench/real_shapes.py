"""LLaVA-1.5 target/draft pairs of real shapes, built in memory with arranged random weights.

Walltime depends on shapes, not on what the weights know, but speculative decoding also needs
a draft that agrees with its target often. Random weights give that when they are arranged as
a *successor table*: every model predicts `successor(current token)` by a wide margin.

- Token embeddings have std 1, and every attention and MLP output projection (o_proj,
  down_proj) is scaled by `RESIDUAL_SCALE`, so the residual stream at a position stays close to
  its own token's embedding; the final RMSNorm (weight 1) rescales it to norm sqrt(hidden).
- The LM head row of token w is `LOGIT / sqrt(hidden)` times the unit embedding of the token v
  with successor(v) = w: the logit of w is about `LOGIT` when v is the current token and
  `LOGIT * cos(e_v, e_current)` (near 0 for random embeddings) otherwise. Special tokens have
  zero rows, so `</s>` and `<image>` are never predicted and decodes run their full length.
- Image feature rows only reach the last prompt token through attention, whose output is
  scaled down like every other residual update, so they cannot change its prediction.
- The target's successor is one random cycle through all ordinary tokens (no token repeats
  before the whole vocabulary has been visited). The draft uses the same table except on a
  fraction 1 - agreement of tokens, where its successor is the target's successor of another
  such token. Those tokens are spread evenly along the cycle (exactly
  `round(AGREEMENT_RUN * (1 - agreement))` at random places in every `AGREEMENT_RUN`
  consecutive tokens), so even a short decode meets the requested agreement.

Since every prompt ends with `ASSISTANT:`, every sample continues with the same chain.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForImageTextToText,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from pipeline.models.hf import HFLlava
from pipeline.models.tiny import SPECIAL_TOKENS, llava_processor, llava_tokenizer

WORDS = (  # the newline (text-only drafting), the prompts' and the stub caption's words
    "\n USER: ASSISTANT: image: describe this image in detail what do you see here write a story "
    "about red square"
).split(" ")
RESIDUAL_SCALE = 0.01
LOGIT = 24.0
AGREEMENT_RUN = 20


@dataclass(frozen=True)
class TextShape:
    hidden: int
    layers: int
    heads: int
    intermediate: int


@dataclass(frozen=True)
class VisionShape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    image_size: int
    patch_size: int

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class PairShape:
    target: TextShape
    draft: TextShape
    vision: VisionShape
    vocab: int


CLIP_L_336 = VisionShape(hidden=1024, layers=24, heads=16, intermediate=4096, image_size=336, patch_size=14)
TINY_VISION = VisionShape(hidden=32, layers=2, heads=2, intermediate=64, image_size=56, patch_size=14)
TARGETS = {
    "7b": TextShape(hidden=4096, layers=32, heads=32, intermediate=11008),
    "13b": TextShape(hidden=5120, layers=40, heads=40, intermediate=13824),
}
DRAFTS = {
    "68m": TextShape(hidden=768, layers=2, heads=12, intermediate=3072),
    "160m": TextShape(hidden=768, layers=12, heads=12, intermediate=3072),
}
TINY = PairShape(
    target=TextShape(hidden=128, layers=2, heads=4, intermediate=256),
    draft=TextShape(hidden=64, layers=2, heads=2, intermediate=128),
    vision=TINY_VISION,
    vocab=512,
)
LLAVA_VOCAB = 32064


def pair_shape(shapes: str, draft: str) -> PairShape:
    """`shapes`: tiny | 7b | 13b; `draft`: 68m | 160m (tiny has its own tiny draft)."""
    if shapes == "tiny":
        return TINY
    return PairShape(target=TARGETS[shapes], draft=DRAFTS[draft], vision=CLIP_L_336, vocab=LLAVA_VOCAB)


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of exactly `vocab_size` tokens: the specials first (ids 0-4),
    a newline token (for text-only drafting), the prompt words, then filler words; BOS added."""
    fillers = [f"w{i}" for i in range(vocab_size - len(SPECIAL_TOKENS) - len(WORDS))]
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS + fillers)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Split(" ", "removed")]
    )
    tok.add_special_tokens(SPECIAL_TOKENS)
    return llava_tokenizer(tok)


def successor_tables(vocab_size: int, agreement: float, seed: int,
                     specials: int = len(SPECIAL_TOKENS)) -> tuple[torch.Tensor, torch.Tensor]:
    """(target, draft) successor of every token id, -1 for the `specials` first ids (never predicted)."""
    if not 0.0 <= agreement <= 1.0:
        raise ValueError(f"agreement must lie in [0, 1], got {agreement}")
    gen = torch.Generator().manual_seed(seed)
    cycle = torch.randperm(vocab_size - specials, generator=gen) + specials
    target = torch.full((vocab_size,), -1, dtype=torch.long)
    target[cycle] = cycle.roll(-1)
    per_run = round(AGREEMENT_RUN * (1.0 - agreement))
    differ = [
        cycle[start + torch.randperm(min(AGREEMENT_RUN, len(cycle) - start), generator=gen)[:per_run]]
        for start in range(0, len(cycle), AGREEMENT_RUN)
    ]
    differ = torch.cat(differ)[torch.randperm(sum(len(d) for d in differ), generator=gen)]
    draft = target.clone()
    if len(differ) > 1:  # each takes the successor of the next one: a different token, still a permutation
        draft[differ] = target[differ.roll(-1)]
    return target, draft


def _config(text: TextShape, vision: VisionShape, tokenizer: PreTrainedTokenizerFast) -> LlavaConfig:
    text_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=text.hidden,
        intermediate_size=text.intermediate,
        num_hidden_layers=text.layers,
        num_attention_heads=text.heads,
        num_key_value_heads=text.heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    vision_config = CLIPVisionConfig(
        hidden_size=vision.hidden,
        intermediate_size=vision.intermediate,
        num_hidden_layers=vision.layers,
        num_attention_heads=vision.heads,
        image_size=vision.image_size,
        patch_size=vision.patch_size,
        projection_dim=768,
    )
    return LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=vision.image_tokens,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )


@torch.no_grad()
def arrange_successor(model: PreTrainedModel, successor: torch.Tensor) -> None:
    """Make `model` predict `successor[current token]` (see the module docstring)."""
    language = model.model.language_model
    embeddings = language.embed_tokens.weight
    embeddings.normal_(0.0, 1.0)
    for layer in language.layers:
        layer.self_attn.o_proj.weight.mul_(RESIDUAL_SCALE)
        layer.mlp.down_proj.weight.mul_(RESIDUAL_SCALE)
    ordinary = (successor >= 0).nonzero().flatten()
    rows = successor[ordinary].to(embeddings.device)
    unit = F.normalize(embeddings[ordinary.to(embeddings.device)].float(), dim=-1)
    head = model.lm_head.weight
    head.zero_()
    head[rows] = (unit * (LOGIT / math.sqrt(embeddings.shape[1]))).to(head.dtype)


def build_llava(
    text: TextShape, vision: VisionShape, tokenizer: PreTrainedTokenizerFast, successor: torch.Tensor,
    device: torch.device, dtype: torch.dtype, seed: int,
) -> LlavaForConditionalGeneration:
    """Allocated and initialised on `device` in `dtype` directly (a 7B model never passes
    through host memory in fp32)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(_config(text, vision, tokenizer), dtype=dtype)
    arrange_successor(model, successor)
    return model.eval()


def build_pair(
    shape: PairShape, agreement: float, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> tuple[HFLlava, HFLlava]:
    """(target, draft) adapters sharing one tokenizer and processor."""
    tokenizer = build_tokenizer(shape.vocab)
    processor = llava_processor(tokenizer, shape.vision.image_size, shape.vision.patch_size)
    target_successor, draft_successor = successor_tables(shape.vocab, agreement, seed)
    target = build_llava(shape.target, shape.vision, tokenizer, target_successor, device, dtype, seed)
    draft = build_llava(shape.draft, shape.vision, tokenizer, draft_successor, device, dtype, seed + 1)
    return HFLlava(target, processor, "target"), HFLlava(draft, processor, "draft")


def step_weight_bytes(model: HFLlava) -> int:
    """Bytes of the weights one decode step reads: decoder layers, final norm and LM head (not
    the embedding table, of which a step reads one row, nor the vision tower)."""
    language = model.model.model.language_model
    modules = (language.layers, language.norm, model.model.lm_head)
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
