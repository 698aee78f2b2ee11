"""How one value of a grid file is checked: each helper returns the value, or raises a
`GridError` naming where it stands in the file (`gamma[1]`, `policies[0].methods`) and what it
should be."""
from __future__ import annotations

from typing import Any, Iterable

from pipeline.names import did_you_mean
from pipeline.planning.grid import GridError


def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise GridError(f"{where}: expected true or false, got {value!r}")
    return value


def listed(value: Any, where: str) -> list:
    """An axis may be written as a scalar or a list; an empty list is an error."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise GridError(f"grid field {where!r} is an empty list")
    return values


def choice(value: Any, choices: Iterable[str], where: str) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise GridError(f"{where}: {value!r} is not one of {list(choices)}{did_you_mean(value, choices)}")
    return value


def shown(value: Any, width: int = 60) -> str:
    """`value`'s repr cut to `width` characters: a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text):,} characters)"


def integer(value: Any, where: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise GridError(f"{where}: expected an integer from {minimum:,} to {maximum:,}, got {shown(value)}")
    return value


def number(value: Any, where: str, *, maximum: float) -> float:
    """A finite number from 0 to `maximum` (an int too large for a float is refused, not raised)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= maximum:
        raise GridError(f"{where}: expected a finite number from 0 to {maximum:g}, got {shown(value)}")
    return float(value)


def model_name(value: Any, where: str) -> str | None:
    """A model named by a string (`embedded`, a hub id or a directory), or None."""
    if value is not None and (not isinstance(value, str) or not value):
        raise GridError(f"{where}: expected a name (embedded, a hub id or a directory), got {value!r}")
    return value
