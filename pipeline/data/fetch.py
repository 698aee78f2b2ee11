"""Write local copies of the public scenario subsets, for machines without hub access.

Run where the hub is reachable::

    python -m pipeline.data.fetch OUT_DIR [NAME ...] [--limit N]

Each NAME (a public dataset of the registry, or ``nq`` / ``gsm8k``; default: all of them)
becomes ``OUT_DIR/NAME``, a ``datasets.save_to_disk`` directory holding only the rows a run
uses (after the Interleave-Bench ``sub_task`` filter) under the public split name. Give it as
``source`` to ``load_samples`` (or, for nq and gsm8k, to ``build_second_turn``). Rows are
streamed, so only the subset is downloaded, not e.g. the whole 3 GB Interleave-Bench file.
"""
from __future__ import annotations

import argparse
import os
from itertools import islice
from pathlib import Path

import datasets

from pipeline.data.loading import iter_rows, open_dataset
from pipeline.data.registry import DATASETS, get_dataset
from pipeline.data.turns import QUESTION_SETS

QUESTION_COUNT = 500  # the reference used the first 500 NQ-open / GSM8K questions
FETCHABLE = tuple(name for name, spec in DATASETS.items() if spec.hub_id) + tuple(QUESTION_SETS)


def fetch(name: str, out_dir: str | os.PathLike, *, limit: int | None = None) -> Path:
    """Save the first `limit` rows (default: the run's subset, or 500 questions) of `name`
    from the hub to `out_dir/name`, and return that path."""
    if name in QUESTION_SETS:
        questions = QUESTION_SETS[name]
        dataset, where = open_dataset(name, questions.hub_id, questions.config, questions.split, None,
                                      ("question",))
        split, count, sub_task = questions.split, limit or QUESTION_COUNT, None
    else:
        spec = get_dataset(name)
        if spec.embedded:
            raise ValueError(f"dataset {name!r} ships with the project; there is nothing to fetch")
        dataset, where = open_dataset(name, spec.hub_id, spec.config, spec.split, None, spec.required_columns)
        split, count, sub_task = spec.split, limit or spec.default_limit, spec.sub_task
    rows = (row for row in iter_rows(name, where, dataset) if sub_task is None or row["sub_task"] == sub_task)
    subset = datasets.Dataset.from_list(list(islice(rows, count)), features=dataset.features)
    path = Path(out_dir) / name
    datasets.DatasetDict({split: subset}).save_to_disk(str(path))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"any of {', '.join(FETCHABLE)} (default: all)")
    parser.add_argument("--limit", type=int, default=None,
                        help="rows per dataset (default: the run's subset)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(FETCHABLE))
    if unknown:
        parser.error(f"unknown name(s) {unknown}; known: {', '.join(FETCHABLE)}")
    for name in args.names or FETCHABLE:
        print(f"{name}: {fetch(name, args.out_dir, limit=args.limit)}")


if __name__ == "__main__":
    main()
