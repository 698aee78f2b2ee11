"""A draft model and a draft-free lookup as one pair's drafters: a draft named `<draft>+<lookup>`
(`pipeline.models.lookup_names.mixed_parts`), whose drafting methods are the model's own (M, T,
C, P: its rows) and L, the lookup (its rows over the token context), so one method set, `ML`
say, is an ensemble across drafters that every weight policy mixes. Everything a prompt needs
is the model's; L's rows are built by the lookup (`LookupMember`)."""
from __future__ import annotations

from typing import Any

import torch

from pipeline.models.base import LVLM
from pipeline.models.lookup_draft import LookupDraft


class MixedDraft:
    """`model` (any draft LVLM that keeps its own rows) and `lookup` drafting for one target;
    every attribute not named here is the model's."""

    drafter = "mixed"

    def __init__(self, model: LVLM, lookup: LookupDraft, name: str) -> None:
        self.model_draft, self.lookup, self.name = model, lookup, name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["model_draft"], name)

    @property
    def prompt_format(self) -> str:
        return self.model_draft.prompt_format

    @prompt_format.setter
    def prompt_format(self, value: str) -> None:
        self.model_draft.prompt_format = value

    @property
    def target_top_k(self) -> int:
        return self.lookup.target_top_k

    def prompt_positions(self, embeds: torch.Tensor) -> torch.Tensor | None:
        """The model's, for its rows; a lookup's row (token ids) has none."""
        return None if embeds.dtype == torch.long else self.model_draft.prompt_positions(embeds)

    def prompt_extras(self, embeds: torch.Tensor) -> Any:
        return None if embeds.dtype == torch.long else self.model_draft.prompt_extras(embeds)
