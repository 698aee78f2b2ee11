"""Adapters for transformers models: LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision and plain causal LMs
(the Qwen-VL, InternVL3 and Gemma 3 adapters build on `HFModel`: `pipeline.models.chat_models`).

They call the library's own classes and caches; image features come from the model's own
`get_image_features`, except pooling (method P), which needs the patch grid before the
projector and so runs the vision tower and projector modules directly.
"""
from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from PIL import Image
from transformers import Cache, CompileConfig, PreTrainedModel, PreTrainedTokenizerBase, StaticCache

from pipeline.models.base import LVLM, ModelInputError, StepLog
from pipeline.models.sharding import on_each_device
from pipeline.models.step_graphs import StepGraphs

log = logging.getLogger(__name__)

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
        self.gpus = len({d for d in getattr(model, "hf_device_map", {}).values() if isinstance(d, int)}) or 1
        self.image_token_id = None
        self._static_caches: dict[tuple[int, int, str], StaticCache] = {}
        self.cache_config = model.config  # what static caches are built from (its layer kinds and sizes)
        self._step_graphs = StepGraphs()
        self.step_compile = STEP_COMPILE  # how decode steps compile (a test swaps in a failing backend)
        self._failed_steps: dict[tuple[int, ...], str] = {}  # step shape -> why its compiled path failed
        self._proven_steps: set[tuple] = set()  # (cache, step shape) whose compiled path has run
        self._compiled: tuple[CompileConfig, Callable[..., Any]] | None = None  # (setting, compiled call)

    @property
    def supports_static_cache(self) -> bool:
        return True

    @property
    def max_positions(self) -> int | None:
        text = getattr(self.model.config, "text_config", None) or self.model.config
        return getattr(text, "max_position_embeddings", None)  # state-space configs have none

    def static_cache(self, batch: int, slots: int, role: str) -> StaticCache:
        key = (batch, slots, role)
        cache = self._static_caches.pop(key, None)
        if cache is None:
            if len(self._static_caches) >= POOLED_CACHES:
                evicted = self._static_caches.pop(next(iter(self._static_caches)))  # the least recently used
                self._step_graphs.forget(evicted)
            cache = StaticCache(config=self.cache_config, max_cache_len=slots)
        else:
            cache.reset()
        self._static_caches[key] = cache
        return cache

    def rewind_static_cache(self, cache: Cache, length: int) -> None:
        # transformers' StaticLayer writes at its `cumulative_length` (a device tensor, so
        # setting it is no host sync); there is no public crop for static caches. Two fused
        # kernels per GPU set every layer's, instead of one launch per layer.
        for lengths in on_each_device([layer.cumulative_length for layer in cache.layers]):
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
        steps: StepLog | None = None,
        hidden: tuple[int, ...] = (),
        **prefill: Any,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ids = None if input_ids is None else input_ids.to(self.device)
        mask, positions = attention_mask.to(self.device), position_ids.to(self.device)
        if compiled and ids is not None:  # a decode step (a head's also carries its `features`)
            return self._compiled_step(cache, keep, StepLog() if steps is None else steps, hidden,
                                       input_ids=ids, attention_mask=mask, position_ids=positions, **prefill)
        return self._forward(cache, keep, False, input_ids=ids, inputs_embeds=inputs_embeds,
                             attention_mask=mask, position_ids=positions, hidden=hidden, **prefill)

    def _compiled_step(self, cache: StaticCache, keep: int, steps: StepLog, hidden: tuple[int, ...],
                       **tensors: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """A decode step through the compiled forward (on a GPU captured as a CUDA graph). If
        compiling or capturing fails, the step runs as a plain forward, and so does every later
        step of that shape: a failure is met once per model and step shape, logged once, and
        noted in `steps` each time. A failure counts only when the plain forward then works;
        otherwise that forward's own error is raised (a bad input fails either way)."""
        ids = tensors["input_ids"]
        shape = (ids.shape[0], ids.shape[1], keep, cache.layers[0].max_cache_len, hidden)
        plain = lambda: self._forward(cache, keep, False, hidden=hidden, **tensors)
        failure = self._failed_steps.get(shape)
        if failure is None:
            key = (id(cache), shape)
            lengths = [layer.cumulative_length for layer in cache.layers]
            # a first compile or capture may fail after some layers wrote: keep their write positions
            saved = None if key in self._proven_steps else [length.clone() for length in lengths]
            try:
                out, mode = self._fast_step(cache, keep, hidden, tensors)
            except Exception as err:
                if saved is None:  # a step that ran compiled before: its cache state is unknown now
                    raise
                torch._foreach_copy_(lengths, saved)
                failure = f"compiled {ids.shape[0]}x{ids.shape[1]} step failed ({one_line(err)})"
                out = plain()
                self._failed_steps[shape] = failure
                log.warning("%s: %s; this step shape runs uncompiled from now on", self.name, failure)
            else:
                self._proven_steps.add(key)
                steps.modes.add(mode)
                return out
        else:
            out = plain()
        steps.modes.add("uncompiled")
        steps.fallbacks.add(failure)
        return out

    def _fast_step(self, cache: StaticCache, keep: int, hidden: tuple[int, ...],
                   tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], str]:
        """(output, mode) of the compiled path: a captured CUDA graph on a GPU, else the compiled forward."""
        if self.device.type == "cuda":
            names = tuple(tensors)
            step = lambda *values: self._forward(cache, keep, True, hidden=hidden, **dict(zip(names, values)))
            out = self._step_graphs.run(step, cache, tuple(tensors.values()), (keep, hidden, names))
            return out, "captured"
        return self._forward(cache, keep, True, hidden=hidden, **tensors), "compiled"

    def compiled_call(self) -> Callable[..., Any]:
        """The model's call through torch.compile, made once per compile setting (transformers'
        `get_compiled_call` reads a generation config, which a head's model has not)."""
        if self._compiled is None or self._compiled[0] is not self.step_compile:
            compiled = torch.compile(self.model.__call__, **self.step_compile.to_dict())
            self._compiled = self.step_compile, compiled
        return self._compiled[1]

    def _forward(self, cache: Cache, keep: int, compiled: bool, hidden: tuple[int, ...] = (),
                 **inputs) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """fp32 logits of the last `keep` positions, `[B, keep, V]`; `compiled`: through
        transformers' compiled call (one compile per model, reused for each static shape);
        `hidden`: also the hidden states at those indices (`hidden_states` of transformers' own
        output: 0 the embeddings, i the input of layer i, -1 the final norm's output) at every
        position fed, concatenated: `[B, fed, H * len(hidden)]`."""
        forward = self.compiled_call() if compiled else self.model
        out = forward(**inputs, cache=cache, use_cache=True, logits_to_keep=keep,
                      output_hidden_states=bool(hidden))
        logits = out.logits[:, -keep:].float()
        return (logits, chosen_states(out.hidden_states, hidden)) if hidden else logits

    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        raise ModelInputError(f"{self.name} is a text-only model: it cannot read images "
                              "(use T or C drafting)")


def chosen_states(states: Sequence[torch.Tensor], indices: tuple[int, ...]) -> torch.Tensor:
    """The hidden states at `indices` of a forward's `hidden_states`, side by side."""
    return torch.cat([states[i] for i in indices], -1)


def one_line(err: BaseException) -> str:
    """An error as one short line: its type and the first line of its message (and the next,
    when the first only introduces it, as torch.compile's do), no addresses."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [""]
    text = f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return re.sub(r" at 0x[0-9a-fA-F]+", "", f"{type(err).__name__}: {text}")[:240]


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
        # OneVision treats the images of one prompt together (several images: no tiling), as its
        # processor does
        batch = [list(images)] if self.family == "llava_onevision" else list(images)
        pixels = self.processor.image_processor(batch, return_tensors="pt")
        pixel_values = pixels["pixel_values"].to(self.device, self.dtype)
        config = self.model.config
        if pooled:
            if not self.supports_pooling:
                raise ModelInputError(f"{self.name}: pooled drafting (P) needs a LLaVA-1.5 style model, "
                                      f"not {self.family}")
            return list(self._pooled_features(pixel_values))
        extra = {}
        if self.family != "llava":
            extra["image_sizes"] = pixels["image_sizes"].to(self.device)
        if self.family == "llava_onevision":
            extra.update(vision_aspect_ratio=config.vision_aspect_ratio,
                         batch_num_images=pixels["batch_num_images"])
        out = self.model.model.get_image_features(
            pixel_values=pixel_values,
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            **extra,
        )
        return [f.reshape(-1, f.shape[-1]) for f in out.pooler_output]

    def _pooled_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Method P (docs/algorithm.md §2): select layer(s), drop CLS, 2x2 average pool on the patch
        grid, project."""
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
