"""Which draft names are draft-free lookups, without torch: a pair's draft `pld`, `ngram` or `sam`
with the reference's defaults, or with hyperparameters, `pld(max_matching_ngram_size=3)` (in a
grid file also `{lookup: pld, max_matching_ngram_size: 3}`). The canonical name lists only the
values that differ from the defaults, sorted, so one lookup has one name (and one key)."""
from __future__ import annotations

import re
from typing import Any

from pipeline.lookups import LOOKUP_KINDS
from pipeline.models.head_names import HEAD_METHODS, head_kind
from pipeline.names import did_you_mean

# a head or a lookup reads the target's own prompt: it drafts with that prompt alone
READER_METHODS = HEAD_METHODS
_CALL = re.compile(r"^(?P<kind>[a-z_]+)(?:\((?P<args>[^()]*)\))?$")


class LookupNameError(ValueError):
    """A lookup draft named with an unknown kind or a bad hyperparameter."""


def lookup_spec(name: str) -> tuple[str, dict[str, int]] | None:
    """(kind, every hyperparameter with defaults) of a lookup draft name; None for any other
    draft. LookupNameError names a bad hyperparameter of a known kind."""
    found = _CALL.match(name) if isinstance(name, str) else None
    if found is None or found["kind"] not in LOOKUP_KINDS:  # not a lookup: another draft's name
        return None
    given: dict[str, Any] = {}
    for part in filter(None, (found["args"] or "").split(",")):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not re.fullmatch(r"-?\d+", value):
            raise LookupNameError(f"lookup draft {name!r}: {part.strip()!r} is not <name>=<integer>")
        given[key] = int(value)
    return found["kind"], lookup_params(found["kind"], given, name)


def lookup_entry_name(entry: dict[str, Any]) -> str:
    """A grid file's `{lookup: <kind>, <hyperparameter>: <int>, ...}` as its canonical draft name."""
    kind = entry["lookup"]
    if kind not in LOOKUP_KINDS:
        raise LookupNameError(f"unknown lookup {kind!r}{did_you_mean(str(kind), LOOKUP_KINDS)}; "
                              f"known: {', '.join(LOOKUP_KINDS)}")
    return lookup_name(kind, {k: v for k, v in entry.items() if k != "lookup"})


def lookup_params(kind: str, given: dict[str, Any], where: str) -> dict[str, int]:
    """Every hyperparameter of a `kind` lookup: `given` over its defaults (LookupNameError if bad)."""
    try:
        return LOOKUP_KINDS[kind].check_params(dict(given))
    except ValueError as err:
        raise LookupNameError(f"lookup draft {where!r}: {err}") from None


def lookup_name(kind: str, params: dict[str, Any]) -> str:
    """The canonical draft name of a `kind` lookup with `params` (checked)."""
    full = lookup_params(kind, params, kind)
    defaults = LOOKUP_KINDS[kind].check_params({})
    written = lambda values: f"{kind}({','.join(f'{k}={v}' for k, v in sorted(values.items()))})"
    changed = {k: v for k, v in full.items() if v != defaults[k]}
    if not changed:
        return kind
    # a kind whose values follow from one another (ngram's bounds) names them all where needed
    return written(changed) if lookup_spec(written(changed))[1] == full else written(full)


MIX = "+"  # `<draft>+<lookup>`: a draft model and a lookup, drafting methods M, T, C, P and L
LOOKUP_LETTER = "L"


def mixed_parts(name: str) -> tuple[str, str] | None:
    """(the draft model, the lookup) of an ensemble across drafters' name, else None."""
    model, sep, lookup = name.rpartition(MIX) if isinstance(name, str) else ("", "", "")
    return (model, lookup) if sep and model and lookup_spec(lookup) is not None else None


def model_of(name: str) -> str:
    """The draft model a draft name loads: the model of an ensemble across drafters, else itself."""
    parts = mixed_parts(name)
    return name if parts is None else parts[0]


def drafts_with(draft: str, methods: str, chain: bool = True) -> bool:
    """Whether a grid runs a draft with a method set, verified as a chain or not: a head M
    alone (it reads the target's own prompt); a lookup M alone, a planning one on chains (its
    point mass gives a tree's node one child with mass: the rest would be tokens of probability
    0), a ranking one on every kind; an
    ensemble across drafters the sets that mix L with the model's methods (the model's own sets
    are its own pair's, L alone the lookup's; beside a head, ML); any other draft the sets without L."""
    if lookup_spec(draft) is not None:
        return methods in READER_METHODS and (chain or not plans(draft))
    if (parts := mixed_parts(draft)) is not None:
        own = methods.replace(LOOKUP_LETTER, "")
        return LOOKUP_LETTER in methods and bool(own) and (own in READER_METHODS
                                                           or not reads_target(parts[0]))
    if reads_target(draft):
        return methods in READER_METHODS
    return LOOKUP_LETTER not in methods


def replays(draft: str, chain: bool) -> bool:
    """Whether greedy trace replay scores a draft's configuration: never a head's (it drafts
    from its own guesses, which no teacher-forced pass makes), a planning lookup's as a chain (its
    plan is a function of the prompt and the output so far), every other draft's (an ensemble
    across drafters': its lookup's plans are replayed along the output, block by block), unless
    its lookup learns from the target (`observes`)."""
    return head_kind(model_of(draft)) is None and (chain or not plans(draft)) and not observes(draft)


def observes(draft: str) -> bool:
    """Whether a draft's lookup (alone or in an ensemble) learns from what the target verified
    (`recycling`): what it proposes depends on each block, so it decodes live."""
    parts = mixed_parts(draft)
    spec = lookup_spec(parts[1] if parts else draft)
    return spec is not None and LOOKUP_KINDS[spec[0]].observes


def plans(draft: str) -> bool:
    """Whether a draft is a lookup that proposes one continuation per block (`pld`, `ngram`,
    `sam`): its chain's distributions depend on where a block began. A ranking lookup
    (`lookahead`) weighs the next token by the context alone, position by position, as a model does."""
    spec = lookup_spec(draft)
    return spec is not None and not LOOKUP_KINDS[spec[0]].ranks


def reads_target(name: str) -> bool:
    """Whether a draft is built from its target rather than loaded as a model of its own (a head
    reads the target's states, a lookup its tokens): it speaks the target's tokenizer and
    prompts, drafts with M alone (an ensemble of a head and a lookup: M and L) and loads after
    the target."""
    return head_kind(model_of(name)) is not None or lookup_spec(name) is not None
