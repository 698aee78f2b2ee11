"""Every knob that changes a decoding result, validated up front so bad input fails early."""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.drafting.policies import StaticPolicy, WeightPolicy

METHOD_LETTERS = "MTCP"  # docs/algorithm.md §2: multimodal, text-only, caption, pooled


@dataclass(frozen=True)
class DecodeConfig:
    """One decoding configuration. `methods` is a string of method letters (e.g. "MTCP"); a
    single letter is plain SD with that drafting method. `temperature` 0 means greedy."""

    methods: str = "M"
    policy: WeightPolicy = field(default_factory=StaticPolicy)
    gamma: int = 5
    temperature: float = 0.0
    max_new_tokens: int = 128
    seed: int = 0

    def validate(self) -> None:
        if not self.methods:
            raise ValueError("methods must name at least one drafting method (letters of MTCP)")
        unknown = sorted(set(self.methods) - set(METHOD_LETTERS))
        if unknown:
            raise ValueError(
                f"unknown drafting method letter(s) {unknown} in {self.methods!r}; "
                f"known: M (multimodal), T (text-only), C (caption), P (pooled)"
            )
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"drafting method repeated in {self.methods!r}")
        if self.gamma < 1:
            raise ValueError(f"gamma (draft length) must be >= 1, got {self.gamma}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.policy.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
