"""The name a user probably meant: one helper every layer's "unknown X" message uses (a leaf
module: it imports nothing of the project)."""
from __future__ import annotations

import difflib
from typing import Any, Iterable


def did_you_mean(value: Any, choices: Iterable[Any]) -> str:
    """` (did you mean 'x'?)` for the closest of `choices` to a mistyped `value`, else ``."""
    names = {str(choice) for choice in choices}
    text = str(value)
    same_but_case = sorted(name for name in names if name.lower() == text.lower())
    close = same_but_case or difflib.get_close_matches(text, sorted(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close and close[0] != text else ""
