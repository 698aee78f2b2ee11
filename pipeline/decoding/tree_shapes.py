"""Static tree shapes `(N1, ..., Nd)`, N_k children per node at depth k: their nodes per level
and the bounds a grid's shapes must keep (each node is a token of the target's verify forward).
Torch-free, like the verify kinds that use it."""
from __future__ import annotations

from typing import Any

MAX_TREE_NODES = 512  # a shape tree's nodes: each is a token of the target's verify forward
MAX_TREE_DEPTH = 64  # a tree's depth is its gamma, which a grid bounds the same


def shape_levels(shape: tuple[int, ...]) -> list[int]:
    """Nodes at each depth of a shape tree: N1, N1 N2, N1 N2 N3, ..."""
    levels, width = [], 1
    for children in shape:
        width *= children
        levels.append(width)
    return levels


def check_shape(shape: Any, what: str) -> tuple[int, ...]:
    """A tree shape `(N1, ..., Nd)` as a tuple, or ValueError naming `what`."""
    counts = shape if isinstance(shape, (list, tuple)) else [None]
    if not shape or len(counts) > MAX_TREE_DEPTH or any(
            isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TREE_NODES for n in counts):
        raise ValueError(f"{what} must be a list of 1 to {MAX_TREE_DEPTH} integers from 1 to "
                         f"{MAX_TREE_NODES} (children per node at each depth), got {shape!r}")
    if (nodes := sum(shape_levels(tuple(shape)))) > MAX_TREE_NODES:
        raise ValueError(f"{what} {list(shape)} has {nodes} nodes; at most {MAX_TREE_NODES}")
    return tuple(shape)
