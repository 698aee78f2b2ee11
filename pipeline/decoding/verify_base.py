"""The base of every verify kind and their registry (`pipeline.decoding.verify_spec` has the kinds
and the helpers that make them from grid entries and result rows). Torch-free."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

VERIFY_KINDS: dict[str, type["VerifySpec"]] = {}  # kind -> class, filled as kinds are defined


@dataclass(frozen=True)
class VerifySpec:
    """Base of every verify kind: a chain of `gamma` proposals. A subclass registers under
    `kind=` (else under its import path `module:Class`, when a grid names it) and overrides
    what differs: its knobs (dataclass fields) and its shape arithmetic."""

    kind: ClassVar[str] = ""
    replayable: ClassVar[bool] = True  # greedy trace replay scores it exactly (its path depends on y only)
    samples: ClassVar[bool] = True  # temperature > 0 keeps the target's distribution
    # the draft reads the tree with a tree mask: a state-space draft (one state per row) cannot
    feeds_draft_a_tree: ClassVar[bool] = False

    def __init_subclass__(cls, kind: str = "", **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = kind or f"{cls.__module__}:{cls.__qualname__}"
        known = VERIFY_KINDS.get(cls.kind)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"verify kind {cls.kind!r} is defined twice ({known.__qualname__}, {cls.__qualname__})")
        VERIFY_KINDS[cls.kind] = cls

    @property
    def is_chain(self) -> bool:
        return self.kind == "chain"

    @property
    def label(self) -> str:
        """Its name in tables: `chain`, `candidates`, `dynamic(n=16,k=4)`."""
        return self.kind

    def validate(self) -> None:
        """ValueError naming a bad knob."""

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        """The spec and gamma a configuration of `methods` drafting methods runs (normalised:
        equivalent grid points collapse into one)."""
        return self, gamma

    def tree_nodes(self, gamma: int, methods: int) -> int:
        """Nodes a block feeds the target besides its pending token (a chain: gamma)."""
        return gamma

    def draft_rows(self, methods: int) -> int:
        """Tokens in one draft step: a row per method (calibration times that many one-token rows)."""
        return methods

    def block_shapes(self, gamma: int, methods: int) -> list[tuple[int, int, int]]:
        """(draft steps, nodes, draft rows) of every block shape this kind may use: what
        calibration times and the speedup table costs (a bandit has one per shape)."""
        return [(gamma, self.tree_nodes(gamma, methods), self.draft_rows(methods))]

    def copies_per_method(self, methods: int) -> int:
        """How many rows of each drafting method the draft prefills (a candidate tree's branches)."""
        return 1

    def draft_capacity(self, gamma: int) -> int:
        """Continuation tokens one block feeds the draft's rows."""
        return gamma

    def key_fields(self) -> dict | None:
        """What a configuration key hashes for this kind (None: nothing, as for chains, whose
        keys are those from before trees existed)."""
        return {"kind": self.kind, **asdict(self)}

    def columns(self) -> dict[str, Any]:
        """The row's structured verify columns (tables never parse the label back)."""
        return {"verify_kind": self.kind, "verify_nodes": None, "verify_top_k": None, "verify_shapes": None}
