"""One registry for each kind of plug-in a grid names: drafting methods (by letter), weight
policies and verify kinds (by kind). A class registers as it is defined (its base's
`__init_subclass__` calls `add`), under the name it gives or else its import path
`module:Class` (the same in every process, so rows written by Ray workers agree with the
driver); two classes under one name are refused; a lookup that fails says what is known;
`make` builds a configured instance from a grid entry's knobs. A leaf module, torch-free: grid
files validate without torch, and every layer may use it."""
from __future__ import annotations

from dataclasses import fields
from typing import Any

from pipeline.names import did_you_mean

IMPORT_PATH_HINT = "an import path 'package.module:Class'"


def import_path(cls: type) -> str:
    """The name a class registers under when it gives none: `module:Class`."""
    return f"{cls.__module__}:{cls.__qualname__}"


class Registry(dict):
    """name -> what is registered (a class, or a drafting method's instance) of one `what`."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def add(self, name: str, entry: Any) -> None:
        """Register `entry` under `name`; the same class defined again (a module imported twice)
        replaces itself, another class under a taken name is refused."""
        cls = lambda e: e if isinstance(e, type) else type(e)
        known = self.get(name)
        if known is not None and import_path(cls(known)) != import_path(cls(entry)):
            raise ValueError(f"{self.what} {name!r} is defined twice ({cls(known).__qualname__}, "
                             f"{cls(entry).__qualname__})")
        self[name] = entry

    def find(self, name: str) -> Any:
        if name not in self:
            raise ValueError(f"unknown {self.what} {name!r}{did_you_mean(name, self)}; choose one of "
                             f"{', '.join(map(str, self))} (or {IMPORT_PATH_HINT})")
        return self[name]

    def make(self, name: str, knobs: dict[str, Any], hidden: tuple[str, ...] = (), note: str = "") -> Any:
        """The registered dataclass `name` with `knobs` (its fields; `ALIASES` on the class maps
        other spellings to them; `hidden`: fields set elsewhere, refused here), validated."""
        cls = self.find(name)
        knobs = {getattr(cls, "ALIASES", {}).get(key, key): value for key, value in knobs.items()}
        own = [f.name for f in fields(cls) if f.name not in hidden]
        unknown = sorted(set(knobs) - set(own))
        if unknown:
            raise ValueError(f"{unknown} not a field of {self.what} {name!r}{did_you_mean(unknown[0], own)}; "
                             f"its fields: {own}{note}")
        made = cls(**knobs)
        made.validate()
        return made


def parse_entry(entry: Any, registry: Registry) -> tuple[str, dict[str, Any]]:
    """A grid entry naming one of `registry`'s kinds: a kind alone (`chain`), or a mapping of
    its `kind` and knobs (`{kind: dynamic, nodes: 16}`); (kind, knobs), or ValueError."""
    if isinstance(entry, str):
        return entry, {}
    if not isinstance(entry, dict) or "kind" not in entry:
        raise ValueError(f"expected a kind ({' | '.join(map(str, registry))}) or a mapping with 'kind', "
                         f"got {entry!r}")
    knobs = dict(entry)
    return str(knobs.pop("kind")), knobs
