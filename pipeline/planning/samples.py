"""The samples a grid run decodes: first turns from a sample source, second turns built from
the target's own greedy first-turn answers. No Ray and no storage here: where the answers
are read from is the caller's (`actors.runner` reads the results directory).
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol

from pipeline.data.sample import Sample
from pipeline.data.user_datasets import UserDataset
from pipeline.planning.grid import FIRST_TURN, GridSpec, ModelGroup, Pair, WorkUnit

# (pair, dataset, max_new_tokens) -> the target's greedy first-turn answer per first-turn sample id
AnswerReader = Callable[[Pair, str, int], dict[str, str]]


class SampleSource(Protocol):
    """Where samples come from (the data registry by default; tests inject their own)."""

    def first_turn(self, dataset: str, limit: int | None) -> list[Sample]: ...

    def second_turn(self, first_samples: list[Sample], first_outputs: dict[str, str],
                    task: str) -> list[Sample]: ...


class RegistrySource:
    """Samples from `pipeline.data.registry`, loaded once per dataset, from the local copies
    in `sources` (dataset or question-task name -> path) where given, else the hub; and from
    the grid's own files (`user_datasets`)."""

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
        from pipeline.data.registry import user_dataset_spec

        if (dataset, limit) not in self._cache:
            user = self.user_datasets.get(dataset)
            named = user_dataset_spec(user) if user else dataset
            budget = {} if self.max_image_pixels is None else {"max_image_pixels": self.max_image_pixels}
            self._cache[(dataset, limit)] = load_samples(
                named, limit=limit, source=self.sources.get(dataset), **budget)
        return self._cache[(dataset, limit)]

    def second_turn(self, first_samples: list[Sample], first_outputs: dict[str, str],
                    task: str) -> list[Sample]:
        from pipeline.data import build_second_turn

        return build_second_turn(first_samples, first_outputs, task, source=self.sources.get(task))


class RunSamples:
    """Every sample of one run, per work unit, and by (pair, sample id) for the actors.

    A second-turn prompt holds the target's own first-turn answer, so the same second-turn
    sample id means a different prompt per target and dtype; second turns are built once per
    (target, dtype, dataset, task, max_new_tokens), after the first turn has run.
    """

    def __init__(self, spec: GridSpec, source: SampleSource, answers: AnswerReader) -> None:
        self.spec, self.source, self.answers = spec, source, answers
        self._by_pair: dict[tuple[str, str, str], Sample] = {}
        self._second_turns: dict[tuple, list[Sample]] = {}

    def for_unit(self, unit: WorkUnit) -> list[Sample]:
        first = self.source.first_turn(unit.dataset, self.spec.limit)
        samples = first if unit.turn == FIRST_TURN else self._second_turn(unit, first)
        pair = unit.config.pair
        for sample in samples:
            self._by_pair.setdefault((pair.target, pair.dtype, sample.sample_id), sample)
        return samples

    def first_turn_count(self, dataset: str) -> int:
        """Samples per unit of `dataset`, first turn or second (one second turn per first)."""
        return len(self.source.first_turn(dataset, self.spec.limit))

    def get(self, models: Pair | ModelGroup, sample_id: str) -> Sample:
        """A sample `for_unit` returned for a unit of this pair, or of a pair of this group
        (samples depend on the target and dtype only)."""
        return self._by_pair[(models.target, models.dtype, sample_id)]

    def _second_turn(self, unit: WorkUnit, first: list[Sample]) -> list[Sample]:
        pair, max_new_tokens = unit.config.pair, unit.config.decode.max_new_tokens
        key = (pair.target, pair.dtype, unit.dataset, unit.turn, max_new_tokens)
        if key not in self._second_turns:
            answers = self.answers(pair, unit.dataset, max_new_tokens)
            self._second_turns[key] = self.source.second_turn(first, answers, unit.turn)
        return self._second_turns[key]
