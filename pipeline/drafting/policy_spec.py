"""How ensemble weights are chosen per block: the policy's knobs, validated up front.

It sits with the drafting code that reads it (`pipeline.drafting.policies`); the decoding
configuration holds one.
"""
from __future__ import annotations

from dataclasses import dataclass

POLICY_KINDS = ("static", "grid", "inverse")
GRID_MEASURES = ("hard", "soft", "hard+soft")
DISTANCES = ("kl", "tvd")


@dataclass(frozen=True)
class PolicySpec:
    """How ensemble weights are chosen per block (docs/algorithm.md §3).

    kind: `static` (uniform, IbED), `grid` (TABED MT*: simplex grid, step 1/steps, chosen by
    `measure`), `inverse` (TABED MTCP*: inverse-error weights at `temperature`).
    window: last h history positions (None = ALL). distance: `kl` = KL(p||q) or `tvd`.
    """

    kind: str = "static"
    measure: str = "hard+soft"
    temperature: float = 1.0
    window: int | None = None
    distance: str = "kl"
    steps: int = 10

    def validate(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"unknown weight policy {self.kind!r}; choose one of {POLICY_KINDS}")
        if self.measure not in GRID_MEASURES:
            raise ValueError(f"unknown grid measure {self.measure!r}; choose one of {GRID_MEASURES}")
        if self.distance not in DISTANCES:
            raise ValueError(f"unknown distance {self.distance!r}; choose one of {DISTANCES}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1 or None (ALL), got {self.window}")
        if self.temperature <= 0:
            raise ValueError(f"inverse-error temperature must be > 0, got {self.temperature}")
        if self.steps < 1:
            raise ValueError(f"grid steps must be >= 1, got {self.steps}")

    @property
    def label(self) -> str:
        """Short name used in tables, e.g. `grid(hard+soft)` or `inverse(T=1.0)`."""
        if self.kind == "grid":
            return f"grid({self.measure})"
        if self.kind == "inverse":
            return f"inverse(T={self.temperature:g})"
        return "static"
