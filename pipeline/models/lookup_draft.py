"""A draft-free drafter behind the `LVLM` interface: it speaks its target's tokenizer and prompts,
and drafts with one lookup per row over the token context (`drafter = "lookup"`,
`pipeline.decoding.lookup_rows`). Its "embedding" of a token is the token's id, and of an image
one negative id, so the engine's prompt building hands its rows the token context unchanged."""
from __future__ import annotations

from typing import Any, Sequence

import torch
from PIL import Image

from pipeline.lookups import LOOKUP_KINDS, Lookup, new_lookup
from pipeline.models.base import LVLM, ModelInputError
from pipeline.models.heads.draft import TargetsPrompt


class LookupDraft(TargetsPrompt, LVLM):
    """A `kind` lookup with `params` (every hyperparameter) drafting for `target`."""

    drafter = "lookup"

    def __init__(self, target: LVLM, name: str, kind: str, params: dict[str, int]) -> None:
        self._speak_for(target)
        self.name, self.kind, self.params = name, kind, dict(params)
        self.device, self.dtype = target.device, torch.long
        output = target.model.get_output_embeddings() if hasattr(target, "model") else None
        # the width of the target's logits: a proposal's distribution is over the same tokens
        self.vocab_width = output.weight.shape[0] if output is not None else len(target.tokenizer)
        self.memory = LOOKUP_KINDS[kind].new_memory(self.params)  # what its requests share, if anything

    @property
    def supports_static_cache(self) -> bool:
        return True  # its rows keep no cache: they draft beside a target on either engine

    @property
    def ranks(self) -> bool:
        """Whether its lookup ranks candidates (a distribution a tree grows from) rather than plans."""
        return LOOKUP_KINDS[self.kind].ranks

    @property
    def target_top_k(self) -> int:
        """The target's top tokens an observing lookup learns from at every verified position."""
        return self.params["output_topk"] if LOOKUP_KINDS[self.kind].observes else 0

    def new_lookup(self) -> Lookup:
        """An empty index for one row (over the memory its requests share, if any)."""
        return new_lookup(self.kind, self.params, self.memory)

    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        """Each image as one negative id, distinct within a prompt: no n-gram matches across it."""
        if pooled:
            raise ModelInputError(f"{self.name}: a lookup reads the target's own prompt, never pooled rows")
        return [torch.tensor([[-1 - i]]) for i in range(len(images))]

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(ids, dtype=torch.long)[..., None]

    def spliced(self, embeds: torch.Tensor, parts: Sequence[torch.Tensor | Sequence[int]]) -> torch.Tensor:
        return embeds

    def prompt_extras(self, embeds: torch.Tensor) -> None:
        return None

    def prompt_positions(self, embeds: torch.Tensor) -> None:
        return None

    def logits(self, **inputs: Any) -> torch.Tensor:
        raise ModelInputError(f"{self.name}: a lookup has no forward; its rows propose from the context")
