"""Print Table-1-style block-efficiency tables for a results directory.

    python jobs/summarize.py results [--run smoke] [--csv table.csv]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run from a checkout or a `ray job submit` working directory alike (see jobs/full_grid.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.report import error_counts, tau_table  # noqa: E402
from pipeline.results import read_results  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="results directory written by jobs/full_grid.py")
    parser.add_argument("--run", help="only this run (default: every run under the directory)")
    parser.add_argument("--csv", help="also write the table as CSV to this file")
    args = parser.parse_args(argv)
    df = read_results(args.out, args.run)
    if df.empty:
        print(f"no results under {args.out}", file=sys.stderr)
        return 1
    for run, rows in df.groupby("run", sort=False):
        table = tau_table(rows)
        print(f"run {run}: block efficiency tau ({len(rows)} rows)")
        print(table.to_string(float_format="{:.2f}".format))
        errors = error_counts(rows)
        if not errors.empty:
            print(f"failed samples (left out of tau):\n{errors.to_string(index=False)}")
        if args.csv:
            path = Path(args.csv)
            path = path if df["run"].nunique() == 1 else path.with_name(f"{path.stem}-{run}{path.suffix}")
            table.to_csv(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
