"""Draft-free drafters: a lookup over one request's token context (the prompt's token ids, then
every token kept so far) proposes a continuation, by the reference semantics of transformers'
prompt lookup (`pld`), vLLM's n-gram proposer (`ngram`), SAM-Decoding's suffix automaton
(`sam`), the branch trie of Ant Group's lookahead decoding (`lookahead`, which ranks its
candidates) or Token Recycling's adjacency matrix of the target's own top tokens (`recycling`).
Torch-free, so grid files validate their hyperparameters without torch."""
from __future__ import annotations

from typing import Any

from pipeline.lookups.base import Lookup
from pipeline.lookups.branch_trie import BranchTrieLookup
from pipeline.lookups.ngram import NgramLookup
from pipeline.lookups.prompt_lookup import PromptLookup
from pipeline.lookups.recycling import RecyclingLookup
from pipeline.lookups.suffix_automaton import SuffixAutomatonLookup
from pipeline.names import did_you_mean

LOOKUP_KINDS: dict[str, type[Lookup]] = {
    cls.kind: cls
    for cls in (PromptLookup, NgramLookup, SuffixAutomatonLookup, BranchTrieLookup, RecyclingLookup)
}


def lookup_class(kind: str) -> type[Lookup]:
    """The class of a lookup kind; ValueError names an unknown kind and lists the known ones."""
    if kind not in LOOKUP_KINDS:
        raise ValueError(f"unknown lookup kind {kind!r}{did_you_mean(kind, LOOKUP_KINDS)}; "
                         f"known: {', '.join(LOOKUP_KINDS)}")
    return LOOKUP_KINDS[kind]


def lookup_defaults(kind: str) -> dict[str, int]:
    """Every hyperparameter of a `kind` lookup with its default."""
    return lookup_class(kind).check_params({})


def new_lookup(kind: str, params: dict[str, Any], memory: Any = None) -> Lookup:
    """An empty `kind` lookup with `params` over its defaults (ValueError if either is bad), over
    the `memory` a drafter's requests share (`Lookup.new_memory`; None: its own)."""
    cls = lookup_class(kind)
    return cls(**params) if memory is None else cls(memory=memory, **params)


__all__ = [
    "LOOKUP_KINDS", "BranchTrieLookup", "Lookup", "NgramLookup", "PromptLookup", "RecyclingLookup",
    "SuffixAutomatonLookup",
    "lookup_class", "lookup_defaults", "new_lookup",
]
