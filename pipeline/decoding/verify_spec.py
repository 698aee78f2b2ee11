"""How the target verifies a block's proposals: one chain, or a token tree (the grid's `verify`
axis). Each kind is a registered class, like the weight policies: its knobs, its name in tables,
what a block of it costs (nodes the target reads, rows the draft runs), whether greedy trace
replay scores it and whether it samples. Torch-free, so grid files validate without torch; the
draft's side of each kind (how it proposes, accepts sampled blocks and replays) is a proposer
registered under the same kind (`pipeline.decoding.proposers`).

- `chain`: `gamma` proposals in a row, the mixture's choice at each step (what TABED does).
- `candidates`: each drafting method's own chain and the ensembled chain, `gamma` deep, as
  branches of one tree (merged into a prefix tree when greedy); a single method is a chain.
- `dynamic`: a tree shaped by the mixed draft distribution's confidence, like Spec-LLaVA's:
  `depth` levels (by default the grid's `gamma`: a tree's depth is the draft steps per block,
  so a grid records it as the row's gamma), each keeping the `top_k` children with the
  highest path probability, then the `nodes` most probable nodes of all levels. Its shape
  depends on draft distributions off the target's path, so it runs live; sampled, it is
  verified by SpecExec's rule (the target samples at every node, the walk follows the match).
- `shape` and `bandit` (`pipeline.decoding.tree_shapes`): a static-shape tree `(N1, ..., Nd)`,
  or one such shape per block picked by a UCB1 bandit (the Mamba drafters paper's trees).

A kind of your own is a subclass and its proposer, named by import path in a grid
(`{kind: "pkg.mod:Class"}`), like a policy (docs/extending.md).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from pipeline.decoding.tree_shapes import BanditTree, ShapeTree
from pipeline.decoding.verify_base import VERIFY_KINDS, VerifySpec
from pipeline.names import did_you_mean

__all__ = ["VERIFY_KINDS", "VerifySpec", "Chain", "CandidateTree", "DynamicTree", "ShapeTree", "BanditTree",
           "candidate_branches", "verify_class", "make_verify", "verify_of_row"]
DYNAMIC_NODES, DYNAMIC_TOP_K = 16, 4


@dataclass(frozen=True)
class Chain(VerifySpec, kind="chain"):
    """`gamma` proposals in a row: the mixture's choice at each step."""

    def key_fields(self) -> dict | None:
        return None


@dataclass(frozen=True)
class CandidateTree(VerifySpec, kind="candidates"):
    """The ensembled chain and each method's own chain as branches of one tree (TABED's
    multi-candidate extension), drafted as B x m rows of one batch."""

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        return (Chain(), gamma) if methods == 1 else (self, gamma)  # one method's tree is its chain

    def tree_nodes(self, gamma: int, methods: int) -> int:
        return candidate_branches(methods) * gamma

    def draft_rows(self, methods: int) -> int:
        return candidate_branches(methods) * methods

    def copies_per_method(self, methods: int) -> int:
        return candidate_branches(methods)

    def key_fields(self) -> dict | None:
        return {"kind": self.kind, "nodes": None, "top_k": None}  # the keys candidate trees had before kinds were classes


@dataclass(frozen=True)
class DynamicTree(VerifySpec, kind="dynamic"):
    """Spec-LLaVA's dynamic tree: `depth` levels (None: the grid's gamma) of the `top_k`
    children with the highest path probability, then the `nodes` most probable nodes."""

    replayable: ClassVar[bool] = False
    feeds_draft_a_tree: ClassVar[bool] = True
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

    def key_fields(self) -> dict | None:
        return {"kind": self.kind, "nodes": self.nodes, "top_k": self.top_k}  # depth is folded into gamma

    def columns(self) -> dict[str, Any]:
        return super().columns() | {"verify_nodes": self.nodes, "verify_top_k": self.top_k}


def candidate_branches(methods: int) -> int:
    """Branches of a candidate tree: the ensembled chain and each method's own (one method: one)."""
    return 1 if methods == 1 else methods + 1


def verify_class(kind: str) -> type[VerifySpec]:
    if kind not in VERIFY_KINDS:
        raise ValueError(f"unknown verify kind {kind!r}{did_you_mean(kind, VERIFY_KINDS)}; choose one of "
                         f"{', '.join(VERIFY_KINDS)} (or an import path 'package.module:Class')")
    return VERIFY_KINDS[kind]


def make_verify(entry: Any) -> VerifySpec:
    """A grid entry (`chain`, `candidates`, `{kind: dynamic, nodes: 16, top_k: 4, depth: 6}`, a
    registered kind of your own) as a validated spec; ValueError names what is wrong."""
    if isinstance(entry, VerifySpec):
        entry.validate()
        return entry
    if isinstance(entry, str):
        entry = {"kind": entry}
    if not isinstance(entry, dict) or "kind" not in entry:
        raise ValueError(f"expected a kind ({', '.join(VERIFY_KINDS)}) or a mapping with 'kind', got {entry!r}")
    knobs = dict(entry)
    cls = verify_class(str(knobs.pop("kind")))
    knobs = {getattr(cls, "ALIASES", {}).get(name, name): value for name, value in knobs.items()}
    knobs = {name: _tupled(value) for name, value in knobs.items()}  # YAML lists, hashable
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(knobs) - set(known))
    if unknown:
        raise ValueError(f"{unknown} not a field of a {cls.kind!r} verify entry{did_you_mean(unknown[0], known)}; "
                         f"its fields: kind{''.join(', ' + name for name in known)}")
    spec = cls(**knobs)
    spec.validate()
    return spec


def verify_of_row(row: dict) -> VerifySpec:
    """The spec a result row was verified with: from its structured columns, or, for rows from
    before them, its label (`chain`, `candidates`, `dynamic(n=16,k=4)`; null: a chain)."""
    kind = row.get("verify_kind")
    if isinstance(kind, str) and kind:
        shapes = _plain(row.get("verify_shapes"))
        knobs = {"nodes": row.get("verify_nodes"), "top_k": row.get("verify_top_k"), "shapes": shapes,
                 "shape": shapes[0] if shapes else None}
        cls = verify_class(kind)
        known = {f.name for f in fields(cls)}
        return cls(**{k: _plain(v) for k, v in knobs.items() if k in known and v is not None})
    label = row.get("verify")
    if not isinstance(label, str) or label == "chain":
        return Chain()
    if label == "candidates":
        return CandidateTree()
    nodes, top_k = (int(part.split("=")[1]) for part in label.removeprefix("dynamic(").rstrip(")").split(","))
    return DynamicTree(nodes, top_k)


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def _plain(value: Any) -> Any:
    """A stored column value as the dataclass field wants it (numpy numbers and arrays as Python)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    return tuple(tuple(v) if isinstance(v, list) else v for v in value) if isinstance(value, list) else value
