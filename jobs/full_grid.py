"""Run a grid of TABED experiments on Ray and stream the results into a Parquet dataset.

    ray job submit --working-dir . -- python jobs/full_grid.py --grid configs/smoke.yaml --out results
    python jobs/full_grid.py --grid configs/paper_full.yaml --dry-run

Connects to the cluster named by RAY_ADDRESS (set by `ray job submit`), else starts a local
Ray. Rerunning with the same --out skips every row already written.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# `ray job submit` runs this file from the uploaded working directory: import the project
# from there (not from wherever it happens to be installed on the head node).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.runner import GridRunner  # noqa: E402
from jobs.calibrate import calibrate_pairs  # noqa: E402
from pipeline.planning.grid import GridError  # noqa: E402
from pipeline.planning.grid_file import load_grid  # noqa: E402
from pipeline.planning.shards import unit_counts  # noqa: E402
from pipeline.results.store import read_results  # noqa: E402
from pipeline.results.summary import write_summary  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="configs/embedded.yaml", help="grid YAML file (default: %(default)s)")
    parser.add_argument("--out", default="results", help="results dataset directory (default: %(default)s)")
    parser.add_argument("--run", help="run name, the run=<name> partition (default: the grid's name)")
    parser.add_argument("--dry-run", action="store_true", help="validate the grid and print work-unit counts only")
    parser.add_argument("--workers", type=int, help="number of actors (default: one per GPU, else one per CPU)")
    parser.add_argument("--gpus-per-worker", type=float, help="GPUs per actor (default: 1 if the cluster has GPUs, else 0)")
    parser.add_argument("--cpus-per-worker", type=float, default=1, help="CPUs per actor (default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = load_grid(args.grid)
    except GridError as err:
        print(f"invalid grid {args.grid}: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        print("\n".join(unit_counts(spec)))
        return 0

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:  # "local": a new Ray for this job, even when some `ray start` cluster is running
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1")
    runner = GridRunner(
        spec, args.out, run=args.run, workers=args.workers,
        gpus_per_worker=args.gpus_per_worker, cpus_per_worker=args.cpus_per_worker,
    )
    report = runner.run()
    print(
        f"run {runner.run_name}: {report.rows_written} rows written in {report.shards_written} shards, "
        f"{report.rows_skipped} already present, {report.redispatched} re-dispatched, "
        f"{report.seconds:.1f} s -> {Path(args.out).resolve()}"
    )
    if spec.calibrate:
        pairs = [(p.target, p.draft, p.dtype) for p in spec.pairs]
        calibrate_pairs(pairs, args.out, gamma=max(spec.gamma), repeats=20, ray_tasks=True)
    print(write_summary(args.out, runner.run_name, read_results(args.out, runner.run_name)))
    print(f"tables and plots: {Path(args.out).resolve() / f'_report-{runner.run_name}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
