"""The interface of a draft-free drafter: a lookup over one request's token context (the prompt's
token ids, then every token kept so far) that proposes a continuation, drafting without a model.
Torch-free: grid files validate a lookup's hyperparameters before anything runs."""
from __future__ import annotations

from abc import ABC, abstractmethod
from numbers import Integral
from typing import Any, ClassVar, Mapping, Sequence

from pipeline.names import did_you_mean


class Lookup(ABC):
    """An index over one request's token context; one instance serves one request. Its
    hyperparameters are keyword arguments with the reference implementation's defaults."""

    kind: ClassVar[str]
    # a lookup that ranks candidates (`counts`) rather than proposing one continuation (`propose`)
    ranks: ClassVar[bool] = False
    # a lookup that learns from the target's top tokens at every token it verified (`observe`)
    observes: ClassVar[bool] = False
    # hyperparameter -> (default, least allowed value); every hyperparameter is an integer
    PARAMS: ClassVar[dict[str, tuple[int, int]]]

    def __init__(self, **params: int) -> None:
        self.params = self.check_params(params)

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> dict[str, int]:
        """Every hyperparameter, `params` over the defaults, checked without building an index (a
        grid file is validated before anything runs). ValueError names an unknown or bad one."""
        for name, value in params.items():
            if name not in cls.PARAMS:
                raise ValueError(f"{cls.kind} lookup: unknown hyperparameter {name!r}"
                                 f"{did_you_mean(name, cls.PARAMS)}; known: {', '.join(cls.PARAMS)}")
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise ValueError(f"{cls.kind} lookup: {name} must be an integer, got {value!r}")
            least = cls.PARAMS[name][1]
            if value < least:
                raise ValueError(f"{cls.kind} lookup: {name} must be >= {least}, got {value}")
        return cls._complete({name: int(value) for name, value in params.items()})

    @classmethod
    def _complete(cls, given: dict[str, int]) -> dict[str, int]:
        """`given` (each checked alone) over the defaults. A kind whose defaults depend on what
        is given, or whose hyperparameters constrain one another, overrides it."""
        return {name: given.get(name, default) for name, (default, _) in cls.PARAMS.items()}

    @classmethod
    def new_memory(cls, params: dict[str, int]) -> Any:
        """State its instances share across the requests of one drafter (None: none; each request's
        index is its own)."""
        return None

    @property
    @abstractmethod
    def max_tokens(self) -> int:
        """The most tokens one proposal holds."""

    @abstractmethod
    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens to the context (the index grows incrementally: amortised, no
        rebuild)."""

    def observe(self, token: int, top: Sequence[int]) -> None:
        """An observing lookup: the target's top tokens right after `token`, where it just verified it."""
        raise NotImplementedError(f"{self.kind} does not learn from the target")

    def counts(self, suffix: Sequence[int] = ()) -> dict[int, int]:
        """A ranking lookup's weight for each token that may come next after context + `suffix`
        ({} when none may); the index is left as it was."""
        raise NotImplementedError(f"{self.kind} proposes one continuation, it ranks nothing")

    @abstractmethod
    def propose(self, suffix: Sequence[int] = ()) -> list[int]:
        """The continuation (at most `max_tokens` ids, [] when nothing matches) the lookup proposes
        after context + `suffix`, where `suffix` are tokens not committed yet (a block's pending
        tokens). The index is left as it was."""

    def plan(self, suffix: Sequence[int] = ()) -> list[int]:
        """`propose`'s continuation cut before its first negative id: a prompt's image stands in
        the context as one negative id, which a draft never proposes."""
        plan: list[int] = []
        for token in self.propose(suffix):
            if token < 0:
                break
            plan.append(token)
        return plan
