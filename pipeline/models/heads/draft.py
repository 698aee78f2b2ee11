"""Head drafts behind the `LVLM` interface: they speak the target's prompts (tokens, image rows,
positions) and borrow its embeddings and LM head. `HeadDraft`'s module (an `EagleHead`, say) turns
a token and the features before it into the next features; its rows are
`pipeline.decoding.head_rows`'s (`drafter = "head"`), which hand every token its features, the
target's at a block's start and the head's own while it drafts. `MedusaDraft`'s heads read only
the target's state at a block's start (`drafter = "medusa"`, `pipeline.decoding.medusa_rows`)."""
from __future__ import annotations

from typing import Any, Sequence

import torch
from PIL import Image
from torch.utils.weak import WeakTensorKeyDictionary
from transformers import Cache, PreTrainedModel

from pipeline.models.base import LVLM, ModelInputError
from pipeline.models.heads.prompt import PromptRows
from pipeline.models.hf import HFModel


class TargetsPrompt:
    """What a head draft takes from its target: its tokenizer, prompts, image rows, positions and
    end tokens; it notes which rows of a spliced prompt are image rows (MSD and ViSpec read them
    apart)."""

    target: LVLM

    def _speak_for(self, target: LVLM) -> None:
        self.target, self.tokenizer, self.image_token_id = target, target.tokenizer, target.image_token_id
        self._visual = WeakTensorKeyDictionary()  # a spliced prompt row -> which of its rows are image rows

    @property
    def max_positions(self) -> int | None:
        return self.target.max_positions

    @property
    def eos_token_ids(self) -> set[int]:
        return self.target.eos_token_ids

    def tokenize_prompt(self, text: str) -> list[int]:
        return self.target.tokenize_prompt(text)

    def image_features(self, images: Sequence[Image.Image], pooled: bool = False) -> list[torch.Tensor]:
        if pooled:
            raise ModelInputError(f"{self.name}: a head reads the target's own prompt; it has no pooled rows")
        return self.target.image_features(images)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed_tokens(ids)

    def spliced(self, embeds: torch.Tensor, parts: Sequence[torch.Tensor | Sequence[int]]) -> torch.Tensor:
        """The target's splice, its image rows noted (a head that reads them apart, MSD's, asks)."""
        embeds = self.target.spliced(embeds, parts)
        self._visual[embeds] = torch.cat([torch.full((len(part),), isinstance(part, torch.Tensor))
                                          for part in parts])
        return embeds

    def prompt_extras(self, embeds: torch.Tensor) -> torch.Tensor | None:
        """`[L]` bool: the prompt row's image rows (None for a row spliced elsewhere)."""
        return self._visual.get(embeds)

    def prompt_positions(self, embeds: torch.Tensor) -> torch.Tensor | None:
        return self.target.prompt_positions(embeds)


class HeadDraft(TargetsPrompt, HFModel):
    """`module` (an `EagleHead`-like model: `target_layers`, `fuse`, a forward over fused rows and
    `next_logits`) drafting for `target`. `logits` returns the head's predicted features beside
    the logits."""

    drafter = "head"

    def __init__(self, module: PreTrainedModel, target: LVLM, name: str, kind: str) -> None:
        super().__init__(module, target.tokenizer, name)
        self._speak_for(target)
        self.kind, self.target_layers = kind, module.target_layers
        self.target_positions = module.target_positions  # M-RoPE's: its rows take the target's positions
        self._lm_head = target.model.get_output_embeddings()

    def fuse_prompt(self, embeds: torch.Tensor, features: torch.Tensor,
                    visual: torch.Tensor | None = None) -> PromptRows:
        """A prompt's input rows: its embeddings, each beside the target's features before it
        (`visual`: its image rows), with what its kind also makes of them (ViSpec's unseen rows
        and image summary)."""
        return self.model.fuse_prompt(embeds, features, visual)

    def _forward(self, cache: Cache, keep: int, compiled: bool, hidden: tuple[int, ...] = (), *,
                 attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                 features: torch.Tensor | None = None, image_summary: torch.Tensor | None = None,
                 **unused: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp32 logits of the last `keep` positions, the predicted features at every row fed):
        `inputs_embeds` are fused prompt rows; `input_ids` come with `features` (and ViSpec's
        `image_summary` per row)."""
        if hidden:
            raise ModelInputError(f"{self.name}: a head only drafts; it has no hidden states to give")
        if input_ids is not None:
            inputs_embeds = self.model.fuse(self.target.embed_tokens(input_ids), features, image_summary)
        body = self.compiled_call() if compiled else self.model
        states = body(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                      cache=cache)
        return self.model.next_logits(states[:, -keep:], self._lm_head), states


class MedusaDraft(TargetsPrompt, LVLM):
    """Medusa's heads drafting for `target` (`pipeline.models.heads.medusa`): no cache and no
    forward of their own past a block's start, where `head_logits` reads the target's state."""

    drafter = "medusa"

    def __init__(self, module: torch.nn.Module, target: LVLM, name: str, kind: str) -> None:
        self._speak_for(target)
        self.model, self.name, self.kind, self.target_layers = module.eval(), name, kind, module.target_layers
        self.device, self.dtype = target.device, target.dtype

    @property
    def supports_static_cache(self) -> bool:
        return True  # its rows keep nothing: they draft beside a target on either engine

    @property
    def heads(self) -> int:
        return len(self.model)

    @torch.inference_mode()
    def head_logits(self, states: torch.Tensor) -> torch.Tensor:
        """`[B, K, V]` fp32: every head's logits from the target's states `[B, F]`."""
        return self.model(states.to(self.dtype))

    def logits(self, **inputs: Any) -> torch.Tensor:
        raise ModelInputError(f"{self.name}: Medusa's heads read the target's states, not a cache of "
                              "their own")
