"""How the target verifies a block's proposals: one chain, or a token tree (the grid's `verify`
axis). Names and knobs only, so grid files validate without torch; the trees themselves are
`pipeline.decoding.trees` and their drafting `pipeline.decoding.proposers`.

- `chain`: `gamma` proposals in a row, the mixture's choice at each step (what TABED does).
- `candidates`: each drafting method's own chain and the ensembled chain, `gamma` deep, as
  branches of one tree (merged into a prefix tree when greedy); a single method is a chain.
- `dynamic`: a tree shaped by the mixed draft distribution's confidence, like Spec-LLaVA's:
  `depth` levels (by default the grid's `gamma`: a tree's depth is the draft steps per block,
  so a grid records it as the row's gamma), each keeping the `top_k` children with the
  highest path probability (several siblings where the draft is unsure, one where it is
  sure), then the `nodes` most probable nodes of all levels. Greedy only: its shape depends on draft distributions off the target's
  path, so it also runs live, never by trace replay.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

VERIFY_KINDS = ("chain", "candidates", "dynamic")
DYNAMIC_NODES, DYNAMIC_TOP_K = 16, 4


@dataclass(frozen=True)
class VerifySpec:
    """`kind` of `VERIFY_KINDS`; `nodes`, `top_k` and optionally `depth` (else gamma) for
    `dynamic` trees (None elsewhere)."""

    kind: str = "chain"
    nodes: int | None = None
    top_k: int | None = None
    depth: int | None = None

    @property
    def is_chain(self) -> bool:
        return self.kind == "chain"

    @property
    def label(self) -> str:
        """Its name in tables: `chain`, `candidates`, `dynamic(n=16,k=4)`."""
        return f"dynamic(n={self.nodes},k={self.top_k})" if self.kind == "dynamic" else self.kind

    @property
    def replayable(self) -> bool:
        """Whether greedy trace replay scores it exactly: its accepted path depends only on
        the draft's distributions along the target's own output."""
        return self.kind != "dynamic"

    def validate(self) -> None:
        if self.kind not in VERIFY_KINDS:
            raise ValueError(f"unknown verify kind {self.kind!r}; choose one of {VERIFY_KINDS}")
        knobs = {"nodes": self.nodes, "top_k": self.top_k, "depth": self.depth}
        if self.kind != "dynamic":
            if any(v is not None for v in knobs.values()):
                raise ValueError(f"verify kind {self.kind!r} takes no nodes, top_k or depth (those are for 'dynamic')")
            return
        for name, value in knobs.items():
            if name == "depth" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"dynamic tree {name} must be an integer >= 1, got {value!r}")

    def for_gamma(self, gamma: int) -> VerifySpec:
        """The same tree at depth `gamma`: a dynamic tree holds at most gamma x top_k nodes."""
        if self.kind != "dynamic":
            return self
        return replace(self, nodes=min(self.nodes, gamma * self.top_k))

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        """The spec and gamma a configuration of `methods` drafting methods runs: one method's
        candidate tree is its chain; a dynamic tree's `depth` is its gamma (the draft steps per
        block, recorded as such), and it holds at most gamma x top_k nodes."""
        if self.kind == "candidates" and methods == 1:
            return VerifySpec(), gamma
        gamma = self.depth or gamma
        return replace(self, depth=None).for_gamma(gamma), gamma

    def tree_nodes(self, gamma: int, methods: int) -> int:
        """Nodes a block feeds the target besides its pending token (a chain: gamma)."""
        if self.kind == "dynamic":
            return self.for_gamma(gamma).nodes
        if self.kind == "candidates":
            return candidate_branches(methods) * gamma
        return gamma

    def draft_rows(self, methods: int) -> int:
        """Tokens in one draft step: a row per method, per branch of a candidate tree, or per
        method and node of a dynamic tree's level (calibration times that many one-token rows)."""
        if self.kind == "dynamic":
            return methods * self.top_k
        if self.kind == "candidates":
            return candidate_branches(methods) * methods
        return methods

    @staticmethod
    def from_label(label: str | None) -> VerifySpec:
        """The spec a table label names (`chain`, `candidates`, `dynamic(n=16,k=4)`; None: chain)."""
        if not label or label == "chain":
            return VerifySpec()
        if label == "candidates":
            return VerifySpec("candidates")
        nodes, top_k = (int(part.split("=")[1]) for part in label.removeprefix("dynamic(").rstrip(")").split(","))
        return VerifySpec("dynamic", nodes, top_k)


def candidate_branches(methods: int) -> int:
    """Branches of a candidate tree: the ensembled chain and each method's own (one method: one)."""
    return 1 if methods == 1 else methods + 1


def make_verify(entry: Any) -> VerifySpec:
    """A grid entry (`chain`, `candidates`, `{kind: dynamic, nodes: 16, top_k: 4, depth: 6}`)
    as a validated spec; ValueError names what is wrong."""
    if isinstance(entry, VerifySpec):
        entry.validate()
        return entry
    if isinstance(entry, str):
        entry = {"kind": entry}
    if not isinstance(entry, dict) or "kind" not in entry:
        raise ValueError(f"expected a kind ({', '.join(VERIFY_KINDS)}) or a mapping with 'kind', got {entry!r}")
    unknown = sorted(set(entry) - {"kind", "nodes", "top_k", "depth"})
    if unknown:
        raise ValueError(f"{unknown} not a field of a verify entry; its fields: kind, nodes, top_k, depth")
    fields = dict(entry)
    if fields["kind"] == "dynamic":
        fields.setdefault("nodes", DYNAMIC_NODES)
        fields.setdefault("top_k", DYNAMIC_TOP_K)
    spec = VerifySpec(**fields)
    spec.validate()
    return spec
