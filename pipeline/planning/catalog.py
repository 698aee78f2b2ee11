"""What a grid may name, as the data registry describes it: read by grid validation
(`pipeline.planning.grid_file`, `grid_checks`); tests give their own."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping

from pipeline.data.sample import FOLLOWUP_TURNS


@dataclass(frozen=True)
class Catalog:
    """The dataset names and later-turn tasks a grid may use (the data registry's), which
    datasets have follow-up questions of their own (`FOLLOWUP_TURNS`), and which are read only
    from a local copy, with the `sources` entry that names it."""

    datasets: Collection[str]
    turn_tasks: Collection[str]
    followup_datasets: Collection[str] = ()
    needs_source: Mapping[str, str] = field(default_factory=dict)

    @staticmethod
    def from_registry() -> "Catalog":
        from pipeline.data import DATASETS, TURN_TASKS

        specs = DATASETS.values()
        return Catalog(datasets=tuple(DATASETS), turn_tasks=tuple(TURN_TASKS) + FOLLOWUP_TURNS,
                       followup_datasets=tuple(spec.name for spec in specs if spec.own_turns),
                       needs_source={spec.name: spec.source_key for spec in specs if spec.local_file})

    def source_key(self, dataset: str) -> str:
        """The `sources` entry that names `dataset`'s local copy."""
        return self.needs_source.get(dataset, dataset)
