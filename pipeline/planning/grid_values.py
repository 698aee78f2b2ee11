"""How one value of a grid file is checked: each helper returns the value, or raises a
`GridError` naming where it stands in the file (`gamma[1]`, `policies[0].methods`) and what it
should be."""
from __future__ import annotations

import math
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


def integer(value: Any, where: str, *, minimum: int, maximum: int | None = None) -> int:
    too_big = maximum is not None and isinstance(value, int) and value > maximum
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or too_big:
        bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise GridError(f"{where}: expected an integer {bounds}, got {value!r}")
    return value


def number(value: Any, where: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < 0):
        raise GridError(f"{where}: expected a finite number >= 0, got {value!r}")
    return float(value)
