"""Merge a run's small shard files into files of about --target-mb each, per partition folder.

    python jobs/compact.py results [--run embedded] [--target-mb 128]

Run it once a run has finished, before sharing or archiving the results directory: every row,
its key and content stay as they are, and it is safe to interrupt (docs/cluster.md,
"Compacting a run"). Prints, per run, the files before and after, rows, bytes and seconds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run from a checkout or a `ray job submit` working directory alike (see jobs/full_grid.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.names import did_you_mean  # noqa: E402
from pipeline.storage.compaction import compact_unless_full  # noqa: E402
from pipeline.storage.run_lock import RunLocked  # noqa: E402
from pipeline.storage.store import run_names  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="results directory written by jobs/full_grid.py")
    parser.add_argument("--run", help="only this run (default: every run under the directory)")
    parser.add_argument("--target-mb", type=float, default=128.0,
                        help="size of a merged file in MB (default 128; smaller folders become one file)")
    args = parser.parse_args(argv)
    if args.target_mb <= 0:
        parser.error("--target-mb must be positive")
    runs = run_names(args.out)
    if args.run is not None and args.run not in runs:
        print(f"unknown run {args.run!r} in {args.out}{did_you_mean(args.run, runs)}; runs there: "
              f"{', '.join(runs) or 'none'}", file=sys.stderr)
        return 1
    if not runs:
        print(f"no runs under {args.out}", file=sys.stderr)
        return 1
    failed = False
    for run in [args.run] if args.run is not None else runs:
        try:
            done, line = compact_unless_full(args.out, run, int(args.target_mb * 10**6))
        except RunLocked as err:
            print(f"not compacted: {err}", file=sys.stderr)
            failed = True
            continue
        if done is None:
            print(line, file=sys.stderr)
            return 1
        if done.recovered:
            print(f"run {run}: settled {done.recovered} interrupted compaction(s) first")
        for path in done.unreadable:
            print(f"left as it is: {path} is not a readable Parquet file (a run of its grid moves it aside "
                  "and computes its rows again)", file=sys.stderr)
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
