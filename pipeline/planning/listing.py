"""`python jobs/full_grid.py --list datasets|methods|policies|verify|families`: what a grid may name,
built-in and the grid's own, one line each. Nothing heavy is imported: no torch, no models."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.decoding.verify_kinds import VERIFY_KINDS
from pipeline.drafting.methods import METHODS
from pipeline.drafting.policies import POLICIES
from pipeline.models.families import FAMILIES, TEXT_DRAFTS, RECURRENT_TYPES, TEXT_ONLY
from pipeline.planning.grid import GridSpec
from pipeline.planning.model_ids import TINY_MODELS

if TYPE_CHECKING:
    from pipeline.data.registry import DatasetSpec

KINDS = ("datasets", "methods", "policies", "verify", "families")


def _first_sentence(text: str | None) -> str:
    words = " ".join((text or "").split())
    return words.split(". ")[0].rstrip(".") + "." if words else ""


def _origin(spec: DatasetSpec) -> str:
    """Where a registered dataset's rows come from, and whether they bring follow-up turns."""
    origin = spec.hub_id or f"local copy only (sources.{spec.source_key})"
    origin = "ships with the project" if spec.embedded else origin
    return origin + ("; its own follow-up turns" if spec.own_turns else "")


def listing(kind: str, spec: GridSpec | None = None) -> list[str]:
    """One line per entry of `kind`; entries the grid file `spec` brought are marked `(grid)`."""
    if kind == "datasets":
        from pipeline.data.registry import DATASETS

        lines = [f"{s.name:<18} {s.category:<9} {s.title}: {_origin(s)}" for s in DATASETS.values()]
        own = spec.user_datasets if spec else ()
        return lines + [f"{u.name:<18} {u.category:<9} (grid) {u.path}, question column {u.question!r}"
                        for u in own]
    if kind == "methods":
        own = set(spec.drafting_methods) if spec else set()
        return [f"{letter}  {m.name:<12} {m.description}"
                + ("  (grid)" if f"{type(m).__module__}:{type(m).__qualname__}" in own else "")
                for letter, m in METHODS.items()]
    if kind == "policies":
        return [f"{kind_name:<24} {_first_sentence(cls.__doc__)}" for kind_name, cls in POLICIES.items()]
    if kind == "families":
        return [f"{f.model_type:<16} {f.title}: {f.model_class} (e.g. {f.examples})"
                for f in FAMILIES.values()] + [
            f"{TEXT_ONLY:<16} a plain causal LM (AutoModelForCausalLM), only for pairs marked "
            "text_only: true",
            *(f"{kind:<16} a text-only {family} checkpoint drafting T and C for a {family} target in its "
              "prompt format (pairs marked text_only: true; e.g. google/gemma-3-1b-it)"
              for kind, family in TEXT_DRAFTS.items()),
            f"{'/'.join(RECURRENT_TYPES):<16} state-space drafts (drafts only): Mamba(2)ForCausalLM for "
            "text drafting (T, C; pairs marked text_only: true), or the language model of a LLaVA "
            "checkpoint (every method)",
            "embedded:*       the offline CPU models that ship with the project: embedded:target, and "
            "three drafts, embedded:draft (the target rounded to 4 bits: large), embedded:small_draft "
            "(7M Llama, distilled) and embedded:ssm_draft (6.8M Mamba2, distilled);"
            f" tiny:* tiny models for tests ({', '.join(TINY_MODELS)})",
        ]
    if kind == "verify":
        return [f"{kind_name:<24} {_first_sentence(cls.__doc__)}" for kind_name, cls in VERIFY_KINDS.items()]
    raise ValueError(f"unknown listing {kind!r}; choose one of {KINDS}")
