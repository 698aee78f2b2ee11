"""Every problem of a grid file at once, each with the name its writer probably meant: fixing one
error to meet the next, one run at a time, is the slow way to learn a grid is wrong.
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from pipeline.planning.grid import GridError

T = TypeVar("T")


class GridProblems(GridError):
    """Several problems of one grid, each a line of the message (and an item of `problems`)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"{len(problems)} problems:\n" + "\n".join(f"  {problem}" for problem in problems))
        self.problems = problems


class Problems:
    """Collects the GridErrors of independent checks; `raise_all` raises them as one."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def check(self, parse: Callable[..., T], *args: Any, default: Any = None, **kwargs: Any) -> T | Any:
        """`parse(*args, **kwargs)`, or `default` after noting its error(s)."""
        try:
            return parse(*args, **kwargs)
        except GridProblems as err:
            self.found.extend(err.problems)
        except GridError as err:
            self.found.append(str(err))
        return default

    def each(self, values: list, parse: Callable[[Any, int], T]) -> list[T]:
        """`parse(value, i)` of every entry of a list that parses; the others' errors noted."""
        parsed = [self.check(parse, value, i, default=self) for i, value in enumerate(values)]
        return [value for value in parsed if value is not self]

    def raise_all(self) -> None:
        """One GridError: the problem itself when there is one, else every problem, a line each."""
        if len(self.found) == 1:
            raise GridError(self.found[0])
        if self.found:
            raise GridProblems(self.found)
