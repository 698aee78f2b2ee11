"""What a rerun keeps of the rows already written, and what it computes again.

A row stands when its key — configuration, sample id and the hash of the prompt it was made
from — is one this grid wants, unless it records a failure that can go away by itself (a
resource error). A row of a wanted configuration and sample whose key differs was made from
another prompt (a second turn built from another answer, an image restored since, or a row
written before keys carried the prompt): it is dropped and computed again, so no stale row
survives and no row is written twice. Rows of configurations the grid does not name are left
alone.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from pipeline.data.sample import Sample
from pipeline.decoding.records import RETRYABLE_ERRORS
from pipeline.planning.grid import WorkUnit, row_key

PROMPT_CHANGED = "made from another prompt"
OLD_KEY = "written before keys carried the prompt"


def wanted_rows(units: Iterable[WorkUnit],
                samples_for: Callable[[WorkUnit], list[Sample]]) -> dict[tuple[str, str], str]:
    """(configuration key, sample id) -> row key of every row the units ask for."""
    wanted = {}
    for unit in units:
        config_key = unit.config.key()
        for sample in samples_for(unit):
            wanted[(config_key, sample.sample_id)] = row_key(config_key, sample.sample_id, sample.prompt_hash)
    return wanted


@dataclass
class Resume:
    keep: set[str] = field(default_factory=set)  # keys of wanted rows already written
    recompute: dict[str, str] = field(default_factory=dict)  # key of a written row to drop -> why
    kept_errors: Counter = field(default_factory=Counter)  # error category -> kept error rows
    other: int = 0  # written rows of configurations or samples this grid does not ask for

    def lines(self) -> list[str]:
        """What the rerun does with earlier rows, for the log (nothing when there were none)."""
        lines = []
        if self.keep:
            errors = ", ".join(f"{n} {category}" for category, n in sorted(self.kept_errors.items()))
            lines.append(f"{len(self.keep)} rows already written are kept"
                         + (f" (error rows: {errors})" if errors else ""))
        for reason, n in sorted(Counter(self.recompute.values()).items()):
            lines.append(f"{n} rows are computed again: {reason}")
        if self.other:
            lines.append(f"{self.other} rows of configurations or samples not in this grid "
                         "are left as they are")
        return lines


def reconcile(written: Iterable[Mapping], wanted: Mapping[tuple[str, str], str]) -> Resume:
    """Sort `written` rows (key, config_key, sample_id, prompt_hash, error_category) against `wanted`."""
    resume = Resume()
    wanted_keys = set(wanted.values())
    for row in written:
        key = row["key"]
        if key in wanted_keys:
            category = row.get("error_category")
            if category in RETRYABLE_ERRORS:
                resume.recompute[key] = f"retrying {category} errors"
            else:
                resume.keep.add(key)
                if category:
                    resume.kept_errors[category] += 1
        elif (row["config_key"], row["sample_id"]) in wanted:
            resume.recompute[key] = PROMPT_CHANGED if row.get("prompt_hash") else OLD_KEY
        else:
            resume.other += 1
    return resume
