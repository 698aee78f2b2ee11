"""Adapters for transformers models: LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision and plain causal LMs.

They call the library's own classes and caches; image features come from the model's own
`get_image_features`, except pooling (method P), which needs the patch grid before the
projector and so runs the vision tower and projector modules directly.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from PIL import Image
from transformers import Cache, CompileConfig, PreTrainedModel, PreTrainedTokenizerBase, StaticCache

from pipeline.models.base import LVLM, ModelInputError
from pipeline.models.step_graphs import StepGraphs


POOLED_CACHES = 8  # static caches kept per model (one per rows x slots x role in use)
# inductor kernels without its own CUDA graphs: on a GPU, `step_graphs` captures the steps
STEP_COMPILE = CompileConfig(mode="default")


class HFModel(LVLM):
    """A transformers model driven through `inputs_embeds`/`input_ids` with a Dynamic or
    Static cache. Static caches are pooled and reused across samples: a captured step holds
    the cache tensors' addresses, so new tensors per sample would mean new graphs per sample."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = model.device
        self.dtype = model.dtype
        self.image_token_id = None
        self._static_caches: dict[tuple[int, int, str], StaticCache] = {}
        self._step_graphs = StepGraphs()

    @property
    def supports_static_cache(self) -> bool:
        return True

    def static_cache(self, batch: int, slots: int, role: str) -> StaticCache:
        key = (batch, slots, role)
        cache = self._static_caches.pop(key, None)
        if cache is None:
            if len(self._static_caches) >= POOLED_CACHES:
                evicted = self._static_caches.pop(next(iter(self._static_caches)))  # the least recently used
                self._step_graphs.forget(evicted)
            cache = StaticCache(config=self.model.config, max_cache_len=slots)
        else:
            cache.reset()
        self._static_caches[key] = cache
        return cache

    def rewind_static_cache(self, cache: Cache, length: int) -> None:
        # transformers' StaticLayer writes at its `cumulative_length` (a device tensor, so
        # setting it is no host sync); there is no public crop for static caches. Two fused
        # kernels set every layer's, instead of one launch per layer.
        lengths = [layer.cumulative_length for layer in cache.layers]
        torch._foreach_mul_(lengths, 0)
        torch._foreach_add_(lengths, length)

    @property
    def eos_token_ids(self) -> set[int]:
        """The ids `generate` stops at, so SD ends exactly where plain decoding does."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            return super().eos_token_ids
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids.to(self.device))

    @torch.inference_mode()
    def logits(
        self,
        *,
        cache: Cache,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        keep: int = 1,
        compiled: bool = False,
    ) -> torch.Tensor:
        ids = None if input_ids is None else input_ids.to(self.device)
        mask, positions = attention_mask.to(self.device), position_ids.to(self.device)
        if compiled and ids is not None and self.device.type == "cuda":
            step = lambda i, m, p: self._forward(cache, keep, True, input_ids=i, attention_mask=m, position_ids=p)
            return self._step_graphs.run(step, cache, ids, mask, positions, keep)
        return self._forward(cache, keep, compiled, input_ids=ids, inputs_embeds=inputs_embeds,
                             attention_mask=mask, position_ids=positions)

    def _forward(self, cache: Cache, keep: int, compiled: bool, **inputs) -> torch.Tensor:
        """fp32 logits of the last `keep` positions, `[B, keep, V]`; `compiled`: through
        transformers' compiled call (one compile per model, reused for each static shape)."""
        forward = self.model.get_compiled_call(STEP_COMPILE) if compiled else self.model
        out = forward(**inputs, past_key_values=cache, use_cache=True, logits_to_keep=keep)
        return out.logits[:, -keep:].float()

    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        raise ModelInputError(f"{self.name} is a text-only model: it cannot read images (use T or C drafting)")


class HFLlava(HFModel):
    """A LLaVA family model (`pipeline.models.families`): LLaVA-1.5, LLaVA-NeXT or
    LLaVA-OneVision, through its own transformers class."""

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor.tokenizer, name)
        self.processor = processor
        self.image_token_id = model.config.image_token_id
        self.family = model.config.model_type

    @property
    def supports_pooling(self) -> bool:
        # any-resolution tiles and newline tokens (NeXT, OneVision) have no single patch grid to pool
        return self.family == "llava"

    @torch.inference_mode()
    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        if not images:
            return []
        # OneVision treats the images of one prompt together (several images: no tiling), as its processor does
        batch = [list(images)] if self.family == "llava_onevision" else list(images)
        pixels = self.processor.image_processor(batch, return_tensors="pt")
        pixel_values = pixels["pixel_values"].to(self.device, self.dtype)
        config = self.model.config
        if pooled:
            if not self.supports_pooling:
                raise ModelInputError(f"{self.name}: pooled drafting (P) needs a LLaVA-1.5 style model, not {self.family}")
            return list(self._pooled_features(pixel_values))
        extra = {}
        if self.family != "llava":
            extra["image_sizes"] = pixels["image_sizes"].to(self.device)
        if self.family == "llava_onevision":
            extra.update(vision_aspect_ratio=config.vision_aspect_ratio, batch_num_images=pixels["batch_num_images"])
        out = self.model.model.get_image_features(
            pixel_values=pixel_values,
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            **extra,
        )
        return [f.reshape(-1, f.shape[-1]) for f in out.pooler_output]

    def _pooled_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Method P (docs/algorithm.md §2): select layer(s), drop CLS, 2x2 average pool on the patch grid, project."""
        config = self.model.config
        hidden = self.model.model.vision_tower(pixel_values, output_hidden_states=True).hidden_states
        layers = config.vision_feature_layer
        layers = [layers] if isinstance(layers, int) else layers
        feats = torch.cat([hidden[i] for i in layers], dim=-1)
        if config.vision_feature_select_strategy == "default":
            feats = feats[:, 1:]
        side = math.isqrt(feats.shape[1])
        if side * side != feats.shape[1]:
            raise ModelInputError(f"{self.name}: {feats.shape[1]} patches do not form a square grid to pool")
        grid = feats.transpose(1, 2).reshape(feats.shape[0], feats.shape[2], side, side)
        pooled = F.avg_pool2d(grid, kernel_size=2, stride=2, ceil_mode=True)
        return self.model.model.multi_modal_projector(pooled.flatten(2).transpose(1, 2))
