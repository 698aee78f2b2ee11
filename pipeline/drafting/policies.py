"""Ensemble weight policies (docs/algorithm.md §3): how the weights that mix the drafting
methods are chosen for each block.

A policy is a frozen value: its knobs, its name in grid files (`kind`), its label in tables,
its own validation and which knobs can change its result (`canonical`). For each sample it
starts a `WeightState`, which the decoder drives with two calls, like transformers'
`CandidateGenerator`: `choose()` the weights for the next block, then `update(q, p)` with the
positions the verified block added to the history (positions where the target's p and every
method's q_i were computed from the true prefix). Live decoding and trace replay drive the
same states, which is what makes replay exact.

Adding a policy is one subclass: `class Mine(WeightPolicy, kind="mine")` with its fields,
`label`, `validate`, `canonical` if some knobs do not matter, and `start_state` returning a
`WeightState` (the built-in states live in `weight_states.py`, which holds the torch code, so
that grid files validate without importing torch). A grid file names a policy of your own by
import path, `kind: "package.module:Class"` (`pipeline.planning.plugins`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from pipeline.registry import Registry, import_path

if TYPE_CHECKING:
    import torch

    from pipeline.drafting.weight_states import WeightState

POLICIES = Registry("weight policy")  # kind -> class, filled as policies are defined
DISTANCES = ("kl", "tvd")
GRID_MEASURES = ("hard", "soft", "hard+soft")
# which of equally good grid candidates wins: `most_m` the most weight on the first method
# (then the second, ...), `first` the authors' reference order (itertools.product: the least)
GRID_TIES = ("most_m", "first")
MAX_WINDOW = 1 << 17  # history positions: no answer is longer
MAX_GRID_STEPS = 100  # a simplex grid of 4 methods at 100 steps has 176,851 points, scored every block
MAX_INVERSE_TEMPERATURE = 1000.0
# Knobs a configuration key carried for every policy, at these values where a policy did not
# use them, when all policies shared one field set: keys keep them so that result directories
# written then still resume (pipeline.planning.grid.RunConfig.key).
_KEY_FIELDS_OF_EVERY_POLICY = {"measure": "hard+soft", "temperature": 1.0, "steps": 10}


@dataclass(frozen=True)
class WeightPolicy:
    """Base of every policy. `window`: score only the last h history positions (None: all);
    `distance`: `kl` = KL(p || q) or `tvd`. Both are grid axes, so they sit on every policy;
    a policy that reads neither resets them in `canonical`."""

    kind: ClassVar[str] = ""
    dynamic: ClassVar[bool] = True  # learns from the history: a starred method set (MT*)
    window: int | None = None
    distance: str = "kl"

    def __init_subclass__(cls, kind: str = "", **kwargs) -> None:
        """Registers the class under `kind=`, or else its import path (`pipeline.registry`)."""
        super().__init_subclass__(**kwargs)
        cls.kind = kind or import_path(cls)
        POLICIES.add(cls.kind, cls)

    @property
    def label(self) -> str:
        """Short name used in tables, e.g. `grid(hard+soft)`."""
        return self.kind

    def validate(self) -> None:
        window = self.window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or not 1 <= window <= MAX_WINDOW):
            raise ValueError(f"window must be an integer from 1 to {MAX_WINDOW} or None (ALL), "
                             f"got {self.window!r}")
        if self.distance not in DISTANCES:
            raise ValueError(f"unknown distance {self.distance!r}; choose one of {DISTANCES}")

    def canonical(self) -> WeightPolicy:
        """The same policy with knobs that cannot change its weights reset to their defaults,
        so equivalent grid points collapse into one configuration."""
        return self

    def key_fields(self) -> dict:
        """What a configuration key hashes for this policy."""
        return {"kind": self.kind, **_KEY_FIELDS_OF_EVERY_POLICY, **asdict(self)}

    def start(self, m: int, device: torch.device | str = "cpu") -> WeightState:
        """A fresh state for one sample with `m` drafting methods: uniform weights (1 for a
        single method, which takes no weights) until the history holds positions."""
        from pipeline.drafting.scoring import uniform_weights  # torch: loaded once decoding starts
        from pipeline.drafting.weight_states import FixedWeights

        initial = uniform_weights(m).to(device)  # made on the device once: choosing never copies
        return FixedWeights(initial) if m == 1 else self.start_state(initial)

    def start_state(self, initial: torch.Tensor) -> WeightState:
        """The state for `m = len(initial)` >= 2 methods, starting from uniform `initial` weights."""
        raise NotImplementedError


def make_policy(kind: str, **fields) -> WeightPolicy:
    """The validated policy `kind` with `fields`; an unknown kind or field is a ValueError naming it."""
    return POLICIES.make(kind, fields)


@dataclass(frozen=True)
class StaticPolicy(WeightPolicy, kind="static"):
    """Uniform weights throughout (IbED's averaging of the methods)."""

    dynamic: ClassVar[bool] = False

    def canonical(self) -> WeightPolicy:
        return StaticPolicy()

    def start_state(self, initial: torch.Tensor) -> WeightState:
        from pipeline.drafting.weight_states import FixedWeights

        return FixedWeights(initial)


@dataclass(frozen=True)
class GridSearchPolicy(WeightPolicy, kind="grid"):
    """TABED MT*: the weight vector of a simplex grid (step 1/`steps`) that best fits the
    history by `measure`: `hard` most argmax hits, `soft` least summed distance, `hard+soft`
    most hits with ties broken by least summed KL. `tie` picks among equally good candidates:
    `most_m` (the most weight on M) or `first` (the authors' order, which their numbers used)."""

    measure: str = "hard+soft"
    steps: int = 10
    tie: str = "most_m"

    @property
    def label(self) -> str:
        return f"grid({self.measure})" if self.tie == "most_m" else f"grid({self.measure}, tie {self.tie})"

    @property
    def scoring_distance(self) -> str:
        # hard+soft breaks ties by summed KL whatever `distance` says (docs/algorithm.md §3)
        return "kl" if self.measure == "hard+soft" else self.distance

    def validate(self) -> None:
        super().validate()
        if self.measure not in GRID_MEASURES:
            raise ValueError(f"unknown grid measure {self.measure!r}; choose one of {GRID_MEASURES}")
        steps = self.steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_GRID_STEPS:
            raise ValueError(f"grid steps must be an integer from 1 to {MAX_GRID_STEPS}, got {self.steps!r}")
        if self.tie not in GRID_TIES:
            raise ValueError(f"unknown grid tie rule {self.tie!r}; choose one of {GRID_TIES}")

    def canonical(self) -> WeightPolicy:
        uses_distance = self.measure == "soft"  # hard counts hits; hard+soft always uses KL
        return self if uses_distance else replace(self, distance="kl")

    def key_fields(self) -> dict:
        """Today's tie rule hashes as keys did before there was a choice, so those runs resume."""
        fields = super().key_fields()
        if fields["tie"] == "most_m":
            del fields["tie"]
        return fields

    def start_state(self, initial: torch.Tensor) -> WeightState:
        from pipeline.drafting.weight_states import GridSearchState

        return GridSearchState(initial, steps=self.steps, measure=self.measure,
                               distance=self.scoring_distance, window=self.window, tie=self.tie)


@dataclass(frozen=True)
class InverseErrorPolicy(WeightPolicy, kind="inverse"):
    """TABED MTCP*: w_i proportional to (1 / e_i)^(1 / `temperature`), e_i = method i's summed
    distance from the target over the window."""

    temperature: float = 1.0

    @property
    def label(self) -> str:
        return f"inverse(T={self.temperature:g})"

    def validate(self) -> None:
        super().validate()
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not 0 < self.temperature <= MAX_INVERSE_TEMPERATURE:
            raise ValueError(f"inverse-error temperature must be a finite number > 0 and at most "
                             f"{MAX_INVERSE_TEMPERATURE:g}, got {self.temperature!r}")

    def start_state(self, initial: torch.Tensor) -> WeightState:
        from pipeline.drafting.weight_states import InverseErrorState

        return InverseErrorState(initial, temperature=self.temperature, distance=self.distance,
                                 window=self.window)


