"""Every knob that changes a decoding result, validated up front so bad input fails early."""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.decoding.verify_kinds import Chain, VerifySpec
from pipeline.drafting.methods import check_methods
from pipeline.drafting.policies import StaticPolicy, WeightPolicy

AR = "AR"  # the method set of the autoregressive baseline: the target alone, no draft


@dataclass(frozen=True)
class DecodeConfig:
    """One decoding configuration. `methods` is a string of method letters (e.g. "MTCP",
    `pipeline.drafting.methods.METHODS`); a single letter is plain SD with that drafting
    method, `AR` the baseline (gamma None). `temperature` 0 means greedy; `verify` is a chain
    or a token tree, `gamma` deep."""

    methods: str = "M"
    policy: WeightPolicy = field(default_factory=StaticPolicy)
    gamma: int | None = 5
    temperature: float = 0.0
    max_new_tokens: int = 128
    seed: int = 0
    verify: VerifySpec = field(default_factory=Chain)

    @property
    def is_ar(self) -> bool:
        return self.methods == AR

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def method_label(self) -> str:
        """Paper notation: a dynamic (TABED) ensemble carries a star, e.g. `MT*`."""
        return self.methods + ("*" if self.policy.dynamic else "")

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.is_ar:
            return
        check_methods(self.methods)
        if self.gamma < 1:
            raise ValueError(f"gamma (draft length) must be >= 1, got {self.gamma}")
        self.policy.validate()
        self.verify.validate()
        self.verify.check_gamma(self.gamma)
        self.verify.check_policy(self.policy.dynamic and len(self.methods) > 1)
        if not self.verify.samples and not self.greedy:
            raise ValueError(f"a {self.verify.kind} tree verifies greedy decoding only (it keeps children "
                             "by rank, which sampling's acceptance rule cannot correct for); for sampling "
                             "use chain or candidates")
