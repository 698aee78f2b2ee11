"""Tables (Markdown + CSV) and plots (PNG) for every run in a results directory.

    python jobs/summarize.py results [--run embedded]

Writes OUT/_report-<run>/summary.md, tau.csv, categories.csv, speedup.csv, tau.png,
weights.png, and prints the Markdown.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run from a checkout or a `ray job submit` working directory alike (see jobs/full_grid.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.reports.report_inputs import read_inputs  # noqa: E402
from pipeline.reports.summary import write_summary  # noqa: E402
from pipeline.storage.atomic import UNWRITABLE  # noqa: E402
from pipeline.storage.store import report_dir, run_names  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="results directory written by jobs/full_grid.py")
    parser.add_argument("--run", help="only this run (default: every run under the directory)")
    args = parser.parse_args(argv)
    skipped = lambda path: print(f"skipped {path}: not a readable Parquet file (a run of its grid moves it "
                                 "aside and computes its rows again)", file=sys.stderr)
    written = 0
    for run in [args.run] if args.run else run_names(args.out):
        inputs = read_inputs(args.out, run, on_unreadable=skipped)  # one partition folder at a time
        if not inputs.rows:
            continue
        folder = report_dir(args.out, run).resolve()
        try:
            text = write_summary(args.out, run, inputs)
        except OSError as err:
            if err.errno not in UNWRITABLE:
                raise
            print(f"cannot write the report of run {run} to {folder}: {UNWRITABLE[err.errno]} "
                  f"({err.filename or folder}); once it can be written, run this again (the previous "
                  "report, if any, is kept as it was)", file=sys.stderr)
            return 1
        print(text)
        print(f"reports written to {folder}")
        written += 1
    if not written:
        print(f"no results under {args.out}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
