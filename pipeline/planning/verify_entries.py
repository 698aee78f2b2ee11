"""Verify specs from what users and files hold: a grid entry (`chain`, `{kind: dynamic, ...}`, a kind
of your own by import path) or a result row's structured columns (or, for rows from before them,
its label). Every built-in kind is imported here, so each is registered before a lookup."""
from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from pipeline.decoding.eagle2_kind import Eagle2Tree
from pipeline.decoding.template_kind import TemplateTree
from pipeline.decoding.verify_kinds import (
    VERIFY_KINDS, BanditTree, CandidateTree, Chain, DynamicTree, ShapeTree, VerifySpec,
)
from pipeline.registry import parse_entry

__all__ = ["make_verify", "verify_of_row", "ShapeTree", "BanditTree", "Eagle2Tree", "TemplateTree"]


def make_verify(entry: Any) -> VerifySpec:
    """A grid entry (`chain`, `candidates`, `{kind: dynamic, nodes: 16, top_k: 4, depth: 6}`, a
    registered kind of your own) as a validated spec; ValueError names what is wrong."""
    if isinstance(entry, VerifySpec):
        entry.validate()
        return entry
    kind, knobs = parse_entry(entry, VERIFY_KINDS)
    # YAML lists, hashable
    return VERIFY_KINDS.make(kind, {name: _tupled(value) for name, value in knobs.items()})


def verify_of_row(row: dict) -> VerifySpec:
    """The spec a result row was verified with: from its structured columns, or, for rows from
    before them, its label (`chain`, `candidates`, `dynamic(n=16,k=4)`; null: a chain)."""
    kind = row.get("verify_kind")
    if isinstance(kind, str) and kind:
        shapes = _plain(row.get("verify_shapes"))
        knobs = {"nodes": row.get("verify_nodes"), "top_k": row.get("verify_top_k"), "shapes": shapes,
                 "shape": shapes[0] if shapes else None}
        cls = VERIFY_KINDS.find(kind)
        known = {f.name for f in fields(cls)}
        stored = json.loads(row["verify_knobs"]) if isinstance(row.get("verify_knobs"), str) else {}
        knobs = {k: v for k, v in stored.items() if k not in knobs or knobs[k] is None} | \
            {k: v for k, v in knobs.items() if v is not None}  # knobs no structured column holds
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
