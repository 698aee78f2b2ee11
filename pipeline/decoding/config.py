"""Every knob that changes a decoding result, validated up front so bad input fails early."""
from __future__ import annotations

from dataclasses import dataclass, field

METHOD_LETTERS = "MTCP"  # docs/algorithm.md §2: multimodal, text-only, caption, pooled
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


@dataclass(frozen=True)
class DecodeConfig:
    """One decoding configuration. `methods` is a string of method letters (e.g. "MTCP"); a
    single letter is plain SD with that drafting method. `temperature` 0 means greedy."""

    methods: str = "M"
    policy: PolicySpec = field(default_factory=PolicySpec)
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
