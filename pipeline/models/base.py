"""The one interface every model meets, so the decoding loop never asks which model it has.

A model is driven through token ids and embeddings only: the engine tokenizes a prompt with
each image as ONE placeholder id, asks the model for each image's feature rows, and splices
them in itself. That keeps M/T/C/P drafting, left-padded batches and KV caches identical for
transformers LLaVA-1.5, LLaVA-NeXT, plain causal LMs and the embedded CPU pair.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from PIL import Image
from transformers import Cache, DynamicCache, PreTrainedTokenizerBase


class ModelInputError(ValueError):
    """A prompt or image this model cannot take (clear message, raised before decoding)."""


LAST_HIDDEN = -1  # `hidden_states[-1]`: what a model's LM head reads (after its final norm)

# How a decode step ran: replayed from a captured CUDA graph, through the compiled forward
# without a graph, or as a plain forward.
STEP_MODES = ("captured", "compiled", "uncompiled")


@dataclass
class StepLog:
    """How one decode's steps ran (`STEP_MODES` used) and why any fell back from the compiled
    path, so a row says what its walltime measured."""

    modes: set[str] = field(default_factory=set)
    fallbacks: set[str] = field(default_factory=set)

    @property
    def summary(self) -> str | None:
        """The modes in `STEP_MODES` order joined by `+` (e.g. `captured+uncompiled`); None if no step ran."""
        return "+".join(mode for mode in STEP_MODES if mode in self.modes) or None


class LVLM(ABC):
    """A language model that may also read images. Subclasses own the weights; no state lives
    on the transformers modules themselves."""

    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    #: Id of the single placeholder token that marks one image in a tokenized prompt
    #: (None for a text-only model).
    image_token_id: int | None
    #: Human-readable name (hub id or directory) used in records and errors.
    name: str
    #: A state-space model: its cache is a state per row, rolled back by restoring saved states
    #: (`state_tensors` / `replace_states`), and it only drafts (`pipeline.models.families`).
    recurrent: bool = False
    #: What kind of rows drafts with this model (`pipeline.decoding.drafters` builds them): `kv`,
    #: a KV cache per row; `state`, a recurrent state per row; `head`, a head that reads the
    #: target's hidden states. The model says it; the decoder never probes for it.
    drafter: str = "kv"
    #: The target's hidden states a head draft reads with every token (`logits(hidden=...)`'s
    #: indices); () for a model that reads tokens alone.
    target_layers: tuple[int, ...] = ()
    #: How many of the target's top tokens at every verified position the draft learns from
    #: (Token Recycling's matrix, `pipeline.lookups.recycling`); 0: none.
    target_top_k: int = 0
    #: GPUs its weights are spread over (`pipeline.models.sharding`); `device` is the first, where
    #: its inputs go and its logits, image features and embeddings come back.
    gpus: int = 1
    #: How a chat family renders a prompt (`pipeline.models.families.PROMPT_FORMATS`), set per grid;
    #: a model with one format (LLaVA's, the embedded target's) reads it whatever it says.
    prompt_format: str = "model"

    @property
    def supports_images(self) -> bool:
        return self.image_token_id is not None

    @property
    def max_positions(self) -> int | None:
        """The most positions (prompt and continuation) the model takes; None: no limit."""
        return None

    @property
    def supports_pooling(self) -> bool:
        """Whether `image_features(..., pooled=True)` is available (drafting method P)."""
        return False

    @abstractmethod
    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        """Projected feature rows for each image, `[k_i, hidden]` on `self.device`, ready to
        stand in for that image's placeholder. `pooled` averages the patch grid 2x2 before
        the projector (docs/algorithm.md §2, method P)."""

    @abstractmethod
    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings for token ids (any shape) -> `[..., hidden]`."""

    @abstractmethod
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
        """One forward of the language model over new positions, extending `cache`; `prefill`:
        the prompt rows' `prefill_inputs`, at the prefill only.
        Returns fp32 logits for the last `keep` positions: `[batch, keep, vocab]`, and with
        `hidden` (indices into transformers' `hidden_states`: 0 the embeddings, i the input of
        layer i, -1 what the LM head reads) also those states at every position fed, side by
        side: `[batch, fed, hidden * len(hidden)]`, what a head draft reads. `compiled` asks
        for the compiled forward (static-shape decode steps over a static cache; on a GPU,
        replayed as captured CUDA graphs); a model whose compiled step fails runs it
        uncompiled instead and notes in `steps` how the step ran and why it fell back. Every
        forward, hidden states or not, goes through the family's own (its masks, its extras)."""

    def spliced(self, embeds: torch.Tensor, parts: Sequence[torch.Tensor | Sequence[int]]) -> torch.Tensor:
        """`embeds`, the prompt row made of `parts` in order (image rows as `image_features`
        returned them, or token ids): a model whose positions depend on them (M-RoPE) notes
        the row's coordinates here, for `prompt_positions`."""
        return embeds

    def prompt_positions(self, embeds: torch.Tensor) -> torch.Tensor | None:
        """A prompt row's position ids `[axes, L]` when they are not its plain indices (M-RoPE's
        three coordinates of a row with images); None: positions are 0, 1, 2, ..."""
        return None

    def prompt_extras(self, embeds: torch.Tensor) -> Any:
        """What else a prompt row's prefill needs besides its embeddings and positions, noted in
        `spliced` (Qwen3-VL: its image rows' DeepStack features and where they sit); None for most."""
        return None

    def prefill_inputs(self, extras: Sequence[Any], padding: torch.Tensor) -> dict[str, Any]:
        """Extra inputs of the prefill forward over rows whose `prompt_extras` are `extras`, left-padded
        as `padding` (`[rows, width]`, False at padding) says; each row may be cut short of the
        row it was spliced as (the last prompt token is fed later)."""
        return {}

    def state_tensors(self, cache: Cache) -> list[torch.Tensor]:
        """A recurrent model's state tensors in `cache`, layer by layer: what a rollback restores."""
        raise NotImplementedError(f"{self.name} keeps a KV cache, not a state")

    def replace_states(self, cache: Cache, states: list[torch.Tensor]) -> None:
        """Put `states` (as `state_tensors` lists them, any row count) in the cache's place."""
        raise NotImplementedError(f"{self.name} keeps a KV cache, not a state")

    @property
    def eos_token_ids(self) -> set[int]:
        """Tokens that end generation (the tokenizer's EOS unless a subclass knows better)."""
        eos = self.tokenizer.eos_token_id
        return set() if eos is None else {eos}

    def new_cache(self) -> DynamicCache:
        return DynamicCache()

    @property
    def supports_static_cache(self) -> bool:
        """Whether `static_cache` works (engine `static`); otherwise only `eager` runs."""
        return False

    def static_cache(self, batch: int, slots: int, role: str) -> Cache:
        """A zeroed static cache of `batch` rows and `slots` positions (engine `static`)."""
        raise NotImplementedError(f"{self.name}: this model has no static-cache support; use engine 'eager'")

    def rewind_static_cache(self, cache: Cache, length: int) -> None:
        """Make the next write of `cache` land at slot `length` (rejected proposals are overwritten)."""
        raise NotImplementedError(f"{self.name}: this model has no static-cache support; use engine 'eager'")

    def tokenize_prompt(self, text: str) -> list[int]:
        """Token ids of a prompt (BOS included), each `<image>` as one placeholder id."""
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def synchronize(self) -> None:
        """Wait for queued device work, so timings measure compute and not launch."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
