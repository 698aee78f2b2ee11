"""A pair's `draft:` entry in a grid file as its canonical draft name, before the name is checked
as a model: a head mapping `{head: <kind>, path: ...}` (`<kind>:<path>`), a lookup mapping
`{lookup: <kind>, <hyperparameter>: <int>}` or name (`pld`, `pld(<name>=<int>)`), and an ensemble
across drafters, `[<draft>, <lookup>]` or `<draft>+<lookup>` (its methods M, T, C, P are the
draft's, L the lookup's)."""
from __future__ import annotations

from typing import Any, Callable

from pipeline.models.head_names import HEAD_KINDS
from pipeline.models.lookup_names import MIX, LookupNameError, lookup_entry_name, lookup_spec, mixed_parts
from pipeline.names import did_you_mean
from pipeline.planning.grid import GridError


def draft_entry(entry: Any, where: str, check_model: Callable[[Any, str], str]) -> Any:
    """The canonical name of a draft entry (`check_model` checks each model an ensemble names);
    any other entry as it is, for `check_model` to judge."""
    try:
        if isinstance(entry, dict):
            return lookup_entry_name(entry) if "lookup" in entry else head_name(entry, where)
    except LookupNameError as err:
        raise GridError(f"{where}: {err}") from None
    if isinstance(entry, list) and len(entry) == 2:
        return mixed_name(check_model(entry[0], where), check_model(entry[1], where), where)
    parts = mixed_parts(entry) if isinstance(entry, str) else None
    if parts is not None:
        return mixed_name(check_model(parts[0], where), check_model(parts[1], where), where)
    return entry


def mixed_name(model: str, lookup: str, where: str) -> str:
    """`<draft>+<lookup>`, once the draft is a model of its own and the lookup one."""
    if lookup_spec(model) is not None or mixed_parts(model) is not None:
        raise GridError(f"{where}: beside a lookup goes a draft model or a head, not {model!r}")
    if mixed_parts(f"{model}{MIX}{lookup}") is None:
        raise GridError(f"{where}: {lookup!r} is not a draft-free lookup (pld, ngram, sam) to mix with "
                        f"{model!r}")
    return f"{model}{MIX}{lookup}"


def head_name(entry: dict, where: str) -> str:
    """`{head: <kind>, path: <hub id or directory>}` as the draft name `<kind>:<path>`."""
    if set(entry) != {"head", "path"}:
        raise GridError(f"{where}: a head draft is {{head: <kind>, path: <hub id or directory>}}, got "
                        f"{sorted(entry)}")
    if entry["head"] not in HEAD_KINDS:
        raise GridError(f"{where}.head: unknown head kind {entry['head']!r}"
                        f"{did_you_mean(str(entry['head']), HEAD_KINDS)}; known: {', '.join(HEAD_KINDS)}")
    if not isinstance(entry["path"], str) or not entry["path"]:
        raise GridError(f"{where}.path: a head's path is a hub id or a directory, got {entry['path']!r}")
    return f"{entry['head']}:{entry['path']}"
