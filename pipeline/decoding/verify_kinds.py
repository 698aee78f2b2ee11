"""Every verify kind in one registry (the grid's `verify` axis): one chain or a token tree, each
a registered class like the weight policies: its knobs, its name in tables, what a block of it
costs, whether greedy replay scores it, whether it samples, and the proposer that drafts it.
Torch-free, so grid files validate without torch. A kind of your own is a subclass and its
proposer, named by import path in a grid, like a policy (docs/extending.md)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

from pipeline.decoding.tree_shapes import MAX_TREE_DEPTH, MAX_TREE_NODES, check_shape, shape_levels
from pipeline.registry import Registry, import_path

DYNAMIC_NODES, DYNAMIC_TOP_K = 16, 4
MAX_TOP_K = 64  # children a dynamic tree's node may rank
MAX_BANDIT_SHAPES = 16
MAX_BANDIT_KNOB = 1e6  # c, lam and costs: beyond it one term drowns every other
VERIFY_KINDS = Registry("verify kind")  # kind -> class, filled as kinds are defined


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
        """Registers the class under `kind=`, or else its import path (`pipeline.registry`)."""
        super().__init_subclass__(**kwargs)
        cls.kind = kind or import_path(cls)
        VERIFY_KINDS.add(cls.kind, cls)

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

    def check_gamma(self, gamma: int) -> None:
        """ValueError when a knob disagrees with the configuration's draft steps per block."""

    def check_policy(self, learns: bool) -> None:
        """ValueError when the kind cannot serve a weight policy that learns from the history."""

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        """The spec and gamma a configuration of `methods` drafting methods runs (normalised:
        equivalent grid points collapse into one)."""
        return self, gamma

    def runs_as_chain(self, methods: int) -> bool:
        """Whether `methods` drafting methods verify as one chain (a candidate tree of one is)."""
        return self.settled(methods, 1)[0].is_chain

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
        for name, most in (("nodes", MAX_TREE_NODES), ("top_k", MAX_TOP_K), ("depth", MAX_TREE_DEPTH)):
            value = getattr(self, name)
            if name == "depth" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ValueError(f"dynamic tree {name} must be an integer from 1 to {most}, got {value!r}")

    def check_gamma(self, gamma: int) -> None:
        if self.depth not in (None, gamma):
            raise ValueError(f"a {self.kind} tree's depth is the draft steps per block, its gamma: depth "
                             f"{self.depth} with gamma {gamma} (a grid sets gamma from depth)")

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


@dataclass(frozen=True)
class ShapeTree(VerifySpec, kind="shape"):
    """A static-shape tree `(N1, ..., Nd)`: every node at depth k - 1 has N_k children, the
    top N_k tokens of the mixed draft distribution at it (the Mamba drafters paper's trees).
    Its depth d is the block's gamma; children are ranked, never drawn, so greedy replay scores
    it from the ranks of the target's tokens along its output, and sampling uses SpecExec."""

    proposer: ClassVar[str] = "pipeline.decoding.draft_trees:ShapeTreeProposer"
    shape: tuple[int, ...] = (3, 2, 1)

    @property
    def label(self) -> str:
        return f"shape({'-'.join(map(str, self.shape))})"

    def validate(self) -> None:
        check_shape(self.shape, "a shape tree's shape")

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        return self, len(self.shape)

    def tree_nodes(self, gamma: int, methods: int) -> int:
        return sum(shape_levels(self.shape))

    def draft_rows(self, methods: int) -> int:
        return methods * max([1] + shape_levels(self.shape)[:-1])  # the widest level the draft reads

    def draft_capacity(self, gamma: int) -> int:
        return 1 + sum(shape_levels(self.shape)[:-1])

    def key_fields(self) -> dict:
        return {"kind": self.kind, "shape": list(self.shape)}

    def columns(self) -> dict[str, Any]:
        shapes = [list(self.shape)]
        return super().columns() | {"verify_nodes": self.tree_nodes(0, 1), "verify_shapes": shapes}


@dataclass(frozen=True)
class BanditTree(VerifySpec, kind="bandit"):
    """One shape tree per block out of `shapes`, chosen by a UCB1 bandit per request (the Mamba
    drafters paper's test-time tree search): unplayed shapes first, then the highest mean
    reward plus `c` sqrt(2 ln t / n); a block's reward is -(1 + lam cost(shape)) / (accepted +
    1), tokens produced per unit of cost. `costs`: each shape's cost in target steps (as
    `jobs/calibrate.py` measures them); None: its node count over the largest shape's. Fixed
    by the configuration, so greedy replay scores it exactly."""

    ALIASES: ClassVar[dict[str, str]] = {"lambda": "lam"}  # grid files write `lambda:`
    proposer: ClassVar[str] = "pipeline.decoding.draft_bandit:BanditTreeProposer"
    shapes: tuple[tuple[int, ...], ...] = ((3, 3, 2, 1), (3, 2, 2, 1, 1), (2, 2, 2, 1, 1, 1))
    c: float = 1.0
    lam: float = 0.3
    costs: tuple[float, ...] | None = None

    @property
    def label(self) -> str:
        """`bandit` for the paper's pool and default knobs, else the pool and what differs."""
        default = type(self)()
        if self == default:
            return "bandit"
        knobs = [f"{name}={getattr(self, name)}" for name in ("c", "lam")
                 if getattr(self, name) != getattr(default, name)]
        knobs += [] if self.costs is None else ["costs"]
        return f"bandit({','.join(['-'.join(map(str, s)) for s in self.shapes] + knobs)})"

    def validate(self) -> None:
        if not isinstance(self.shapes, tuple) or not 1 <= len(self.shapes) <= MAX_BANDIT_SHAPES:
            raise ValueError(f"a bandit's shapes must be a list of 1 to {MAX_BANDIT_SHAPES} tree shapes, "
                             f"got {self.shapes!r}")
        for i, shape in enumerate(self.shapes):
            check_shape(shape, f"shapes[{i}]")
        for name in ("c", "lam"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value <= MAX_BANDIT_KNOB:
                raise ValueError(f"a bandit's {name} must be a number from 0 to {MAX_BANDIT_KNOB:g}, "
                                 f"got {value!r}")
        if self.costs is not None and (len(self.costs) != len(self.shapes) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= MAX_BANDIT_KNOB
                for v in self.costs)):
            raise ValueError(f"a bandit's costs must be one number > 0 and at most {MAX_BANDIT_KNOB:g} per "
                             f"shape, got {self.costs!r}")

    def settled(self, methods: int, gamma: int) -> tuple[VerifySpec, int]:
        return self, max(len(shape) for shape in self.shapes)

    def arms(self) -> list[ShapeTree]:
        return [ShapeTree(shape) for shape in self.shapes]

    def arm_costs(self) -> list[float]:
        if self.costs is not None:
            return list(self.costs)
        nodes = [arm.tree_nodes(0, 1) for arm in self.arms()]
        return [n / max(nodes) for n in nodes]

    def block_shapes(self, gamma: int, methods: int) -> list[tuple[int, int, int]]:
        return [shape for arm in self.arms() for shape in arm.block_shapes(len(arm.shape), methods)]

    def tree_nodes(self, gamma: int, methods: int) -> int:
        return max(arm.tree_nodes(gamma, methods) for arm in self.arms())

    def draft_rows(self, methods: int) -> int:
        return max(arm.draft_rows(methods) for arm in self.arms())

    def draft_capacity(self, gamma: int) -> int:
        return max(arm.draft_capacity(gamma) for arm in self.arms())

    def key_fields(self) -> dict:
        return {"kind": self.kind, "shapes": [list(s) for s in self.shapes], "c": self.c, "lam": self.lam,
                "costs": None if self.costs is None else list(self.costs)}

    def columns(self) -> dict[str, Any]:
        return super().columns() | {"verify_shapes": [list(s) for s in self.shapes]}
