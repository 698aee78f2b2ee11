"""The samples a grid run decodes: first turns from a sample source, each later turn built from
the target's own greedy answers to the turn before it (`previous_turn`: the first turn, or the
previous follow-up). No Ray and no storage here: where the answers are read from is the
caller's (`actors.runner` reads the results directory).
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol

from pipeline.data.sample import FOLLOWUP_TURNS, Sample, previous_turn, turn_count
from pipeline.data.user_datasets import UserDataset
from pipeline.planning.grid import FIRST_TURN, GridSpec, ModelGroup, Pair, WorkUnit
from pipeline.planning.timed_samples import choose_timed

# (pair, dataset, turn, max_new_tokens) -> the target's greedy answer per sample id of that turn
AnswerReader = Callable[[Pair, str, str, int], dict[str, str]]


class SampleSource(Protocol):
    """Where samples come from (the data registry by default; tests inject their own)."""

    def first_turn(self, dataset: str, limit: int | None) -> list[Sample]: ...

    def second_turn(self, previous_samples: list[Sample], previous_outputs: dict[str, str],
                    task: str) -> list[Sample]:
        """Samples of turn `task` continuing `previous_samples` (its `previous_turn`'s) with the
        target's answers to them."""


class RegistrySource:
    """Samples from `pipeline.data.registry`, loaded once per dataset, from the local copies
    in `sources` (a dataset's `source_key` or a question-task name -> path) where given, else
    the hub; and from the grid's own files (`user_datasets`)."""

    def __init__(self, sources: dict[str, str] | None = None, user_datasets: Iterable[UserDataset] = (),
                 max_image_pixels: int | None = None) -> None:
        self.sources = sources or {}
        self.user_datasets = {user.name: user for user in user_datasets}
        self.max_image_pixels = max_image_pixels  # None: the data layer's default
        self._cache: dict[tuple[str, int | None], list[Sample]] = {}

    @classmethod
    def for_grid(cls, spec: GridSpec) -> "RegistrySource":
        return cls(dict(spec.sources), spec.user_datasets, spec.max_image_pixels)

    def first_turn(self, dataset: str, limit: int | None) -> list[Sample]:
        from pipeline.data import load_samples  # the data stack loads only when a run needs samples
        from pipeline.data.registry import source_key, user_dataset_spec

        if (dataset, limit) not in self._cache:
            user = self.user_datasets.get(dataset)
            named = user_dataset_spec(user) if user else dataset
            budget = {} if self.max_image_pixels is None else {"max_image_pixels": self.max_image_pixels}
            self._cache[(dataset, limit)] = load_samples(
                named, limit=limit, source=self.sources.get(source_key(dataset)), **budget)
        return self._cache[(dataset, limit)]

    def second_turn(self, previous_samples: list[Sample], previous_outputs: dict[str, str],
                    task: str) -> list[Sample]:
        from pipeline.data import build_followup, build_second_turn

        if task in FOLLOWUP_TURNS:
            return build_followup(previous_samples, previous_outputs, task)
        return build_second_turn(previous_samples, previous_outputs, task, source=self.sources.get(task))


class RunSamples:
    """Every sample of one run, per work unit, and by (pair, sample id) for the actors.

    A later turn's prompt holds the target's own answer to the turn before, so the same
    sample id means a different prompt per target and dtype; later turns are built once per
    (target, dtype, dataset, turn, max_new_tokens), after the turn before has run.
    """

    def __init__(self, spec: GridSpec, source: SampleSource, answers: AnswerReader) -> None:
        self.spec, self.source, self.answers = spec, source, answers
        self._by_pair: dict[tuple[str, str, str], Sample] = {}
        self._later_turns: dict[tuple, list[Sample]] = {}
        self._timed: set[str] | None = None  # `timed_ids`, once asked for

    def for_unit(self, unit: WorkUnit) -> list[Sample]:
        """The unit's samples: every one of its dataset and turn, or for a pair marked
        `timed: only` the grid's walltime samples among them (first turns only)."""
        pair = unit.config.pair
        if pair in self.spec.timed_only:
            first = self.source.first_turn(unit.dataset, self.spec.limit) if unit.turn == FIRST_TURN else []
            samples = [sample for sample in first if sample.sample_id in self.timed_ids()]
        else:
            samples = self._turn(pair, unit.dataset, unit.turn, unit.config.decode.max_new_tokens)
        for sample in samples:
            self._by_pair.setdefault((pair.target, pair.dtype, sample.sample_id), sample)
        return samples

    def count(self, unit: WorkUnit) -> int:
        """The unit's samples, counted before any is built: one per first turn, except for the
        rows a follow-up turn does not reach (and the timed ones alone of a `timed: only` pair)."""
        if unit.config.pair in self.spec.timed_only:
            return len(self.for_unit(unit))
        return turn_count(self.source.first_turn(unit.dataset, self.spec.limit), unit.turn)

    def timed_ids(self) -> set[str]:
        """The grid's walltime samples, as the shard plan deals them (`choose_timed` over the
        first turns of the grid's datasets, in its order)."""
        if self._timed is None:
            spec = self.spec
            first = {dataset: self.source.first_turn(dataset, spec.limit) for dataset in spec.datasets}
            chosen = choose_timed(first, spec.live_samples, spec.live_seed) if spec.mode == "auto" else []
            self._timed = set(chosen)
        return self._timed

    def get(self, models: Pair | ModelGroup, sample_id: str) -> Sample:
        """A sample `for_unit` returned for a unit of this pair, or of a pair of this group
        (samples depend on the target and dtype only)."""
        return self._by_pair[(models.target, models.dtype, sample_id)]

    def _turn(self, pair: Pair, dataset: str, turn: str, max_new_tokens: int) -> list[Sample]:
        if turn == FIRST_TURN:
            return self.source.first_turn(dataset, self.spec.limit)
        key = (pair.target, pair.dtype, dataset, turn, max_new_tokens)
        if key not in self._later_turns:
            before = previous_turn(turn)
            previous = self._turn(pair, dataset, before, max_new_tokens)
            answers = self.answers(pair, dataset, before, max_new_tokens)
            self._later_turns[key] = self.source.second_turn(previous, answers, turn)
        return self._later_turns[key]
