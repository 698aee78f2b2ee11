"""How the target verifies a block's proposals: one chain, or a token tree (the grid's `verify`
axis). Each kind is a registered class, like the weight policies: its knobs, its name in tables,
what a block of it costs (nodes the target reads, rows the draft runs), whether greedy trace
replay scores it and whether it samples. Torch-free, so grid files validate without torch; the
draft's side of each kind (how it proposes, accepts sampled blocks and replays) is a proposer
named by the spec (`proposer`, `pipeline.decoding.draft`); `pipeline.planning.verify_entries`
makes specs from grid entries and result rows.

- `chain`: `gamma` proposals in a row, the mixture's choice at each step (what TABED does).
- `candidates`: each drafting method's own chain and the ensembled chain, `gamma` deep, as
  branches of one tree (merged into a prefix tree when greedy); a single method is a chain.
- `dynamic`: a tree shaped by the mixed draft distribution's confidence, like Spec-LLaVA's:
  `depth` levels (by default the grid's `gamma`: a tree's depth is the draft steps per block,
  so a grid records it as the row's gamma), each keeping the `top_k` children with the
  highest path probability, then the `nodes` most probable nodes of all levels. Its shape
  depends on draft distributions off the target's path, so it runs live; sampled, it is
  verified by SpecExec's rule (the target samples at every node, the walk follows the match).
- `shape` and `bandit` (`pipeline.decoding.shape_kinds`): a static-shape tree `(N1, ..., Nd)`,
  or one such shape per block picked by a UCB1 bandit (the Mamba drafters paper's trees).

A kind of your own is a subclass and its proposer, named by import path in a grid
(`{kind: "pkg.mod:Class"}`), like a policy (docs/extending.md).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

DYNAMIC_NODES, DYNAMIC_TOP_K = 16, 4
VERIFY_KINDS: dict[str, type["VerifySpec"]] = {}  # kind -> class, filled as kinds are defined


@dataclass(frozen=True)
class VerifySpec:
    """Base of every verify kind: a chain of `gamma` proposals. A subclass registers under
    `kind=` (else under its import path `module:Class`, when a grid names it) and overrides
    what differs: its knobs (dataclass fields) and its shape arithmetic."""

    kind: ClassVar[str] = ""
    replayable: ClassVar[bool] = True  # greedy trace replay scores it exactly (its path depends on y only)
    samples: ClassVar[bool] = True  # temperature > 0 keeps the target's distribution
    # the proposer that drafts it (`pipeline.decoding.draft.Proposer`), imported when it decodes
    proposer: ClassVar[str] = "pipeline.decoding.draft:ChainProposer"

    def __init_subclass__(cls, kind: str = "", **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = kind or f"{cls.__module__}:{cls.__qualname__}"
        known = VERIFY_KINDS.get(cls.kind)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"verify kind {cls.kind!r} is defined twice "
                             f"({known.__qualname__}, {cls.__qualname__})")
        VERIFY_KINDS[cls.kind] = cls

    @property
    def is_chain(self) -> bool:
        return self.kind == "chain"

    @property
    def label(self) -> str:
        """Its name in tables: `chain`, `candidates`, `dynamic(n=16,k=4)`; a kind of your own, its
        kind and every knob, `pkg.mod:Kind(width=3)`, so that no table pools two of its entries."""
        knobs = asdict(self)
        return f"{self.kind}({','.join(f'{k}={v}' for k, v in knobs.items())})" if knobs else self.kind

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

    def key_fields(self) -> dict:
        """What a configuration key hashes for this kind: its knobs (the rules that keep older
        rows' keys are `pipeline.planning.grid.key_fields`)."""
        return {"kind": self.kind, **asdict(self)}

    def columns(self) -> dict[str, Any]:
        """The row's structured verify columns (tables never parse the label back)."""
        return {"verify_kind": self.kind, "verify_nodes": None, "verify_top_k": None, "verify_shapes": None,
                "verify_knobs": json.dumps(asdict(self), sort_keys=True)}


@dataclass(frozen=True)
class Chain(VerifySpec, kind="chain"):
    """`gamma` proposals in a row: the mixture's choice at each step."""


@dataclass(frozen=True)
class CandidateTree(VerifySpec, kind="candidates"):
    """The ensembled chain and each method's own chain as branches of one tree (TABED's
    multi-candidate extension), drafted as branches x m rows of one batch per request."""

    proposer: ClassVar[str] = "pipeline.decoding.draft:CandidateProposer"

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        return (Chain(), gamma) if methods == 1 else (self, gamma)  # one method's tree is its chain

    def tree_nodes(self, gamma: int, methods: int) -> int:
        return candidate_branches(methods) * gamma

    def draft_rows(self, methods: int) -> int:
        return candidate_branches(methods) * methods

    def copies_per_method(self, methods: int) -> int:
        return candidate_branches(methods)


@dataclass(frozen=True)
class DynamicTree(VerifySpec, kind="dynamic"):
    """Spec-LLaVA's dynamic tree: `depth` levels (None: the grid's gamma) of the `top_k`
    children with the highest path probability, then the `nodes` most probable nodes."""

    replayable: ClassVar[bool] = False
    proposer: ClassVar[str] = "pipeline.decoding.draft_trees:DynamicTreeProposer"
    nodes: int = DYNAMIC_NODES
    top_k: int = DYNAMIC_TOP_K
    depth: int | None = None

    @property
    def label(self) -> str:
        return f"dynamic(n={self.nodes},k={self.top_k})"

    def validate(self) -> None:
        for name in ("nodes", "top_k", "depth"):
            value = getattr(self, name)
            if name == "depth" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"dynamic tree {name} must be an integer >= 1, got {value!r}")

    def for_gamma(self, gamma: int) -> DynamicTree:
        """The same tree at depth `gamma`: it holds at most gamma x top_k nodes."""
        return replace(self, nodes=min(self.nodes, gamma * self.top_k))

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        gamma = self.depth or gamma  # a tree's depth is its draft steps per block: its gamma
        return replace(self, depth=None).for_gamma(gamma), gamma

    def tree_nodes(self, gamma: int, methods: int) -> int:
        return self.for_gamma(gamma).nodes

    def draft_rows(self, methods: int) -> int:
        return methods * self.top_k

    def draft_capacity(self, gamma: int) -> int:
        return gamma * self.top_k

    def key_fields(self) -> dict:
        return {"kind": self.kind, "nodes": self.nodes, "top_k": self.top_k}  # depth is folded into gamma

    def columns(self) -> dict[str, Any]:
        return super().columns() | {"verify_nodes": self.nodes, "verify_top_k": self.top_k}


def candidate_branches(methods: int) -> int:
    """Branches of a candidate tree: the ensembled chain and each method's own (one method: one)."""
    return 1 if methods == 1 else methods + 1
