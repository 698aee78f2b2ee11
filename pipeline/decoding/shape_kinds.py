"""Static-shape token trees and the bandit that picks one per block (the Mamba drafters paper's
test-time tree search), as verify kinds. Torch-free; their proposers are in
`pipeline.decoding.draft_trees`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.decoding.verify_kinds import VerifySpec

MAX_TREE_NODES = 512  # a shape tree's nodes: each is a token of the target's verify forward


def shape_levels(shape: tuple[int, ...]) -> list[int]:
    """Nodes at each depth of a shape tree: N1, N1 N2, N1 N2 N3, ..."""
    levels, width = [], 1
    for children in shape:
        width *= children
        levels.append(width)
    return levels


def check_shape(shape: Any, what: str) -> tuple[int, ...]:
    """A tree shape `(N1, ..., Nd)` as a tuple, or ValueError naming `what`."""
    if not isinstance(shape, (list, tuple)) or not shape or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
        raise ValueError(f"{what} must be a non-empty list of integers >= 1 (children per node at each "
                         f"depth), got {shape!r}")
    if sum(shape_levels(tuple(shape))) > MAX_TREE_NODES:
        nodes = sum(shape_levels(tuple(shape)))
        raise ValueError(f"{what} {list(shape)} has {nodes} nodes; at most {MAX_TREE_NODES}")
    return tuple(shape)


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
        return super().columns() | {"verify_nodes": self.tree_nodes(0, 1),
                                    "verify_shapes": [list(self.shape)]}


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
        if not isinstance(self.shapes, tuple) or not self.shapes:
            raise ValueError(f"a bandit's shapes must be a non-empty list of tree shapes, "
                             f"got {self.shapes!r}")
        for i, shape in enumerate(self.shapes):
            check_shape(shape, f"shapes[{i}]")
        for name in ("c", "lam"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"a bandit's {name} must be a number >= 0, got {value!r}")
        if self.costs is not None and (len(self.costs) != len(self.shapes) or not all(
                isinstance(v, (int, float)) and v > 0 for v in self.costs)):
            raise ValueError(f"a bandit's costs must be one number > 0 per shape, got {self.costs!r}")

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
