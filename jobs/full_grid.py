"""Run a grid of TABED experiments on Ray and stream the results into a Parquet dataset.

    ray job submit --working-dir . -- python jobs/full_grid.py --grid configs/smoke.yaml --out results
    python jobs/full_grid.py --grid configs/paper_full.yaml --dry-run
    python jobs/full_grid.py --list datasets|methods|policies|verify|families [--grid FILE for its own]

Connects to the cluster named by RAY_ADDRESS (set by `ray job submit`), else starts a local
Ray. Rerunning with the same --out skips every row already written.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

STARTED = time.monotonic()  # the phases' line at the end counts from here

# `ray job submit` runs this from its uploaded working directory: import the project from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.planning.grid import GridError, GridSpec  # noqa: E402  (light: no Ray, no transformers)
from pipeline.planning.grid_bounds import MAX_GPUS_PER_WORKER, check_name  # noqa: E402
from pipeline.planning.grid_file import load_grid  # noqa: E402
from pipeline.planning.listing import KINDS  # noqa: E402
from pipeline.planning.samples import RegistrySource, SampleSource  # noqa: E402
from pipeline.storage.atomic import UNWRITABLE  # noqa: E402

if TYPE_CHECKING:
    from actors.runner import GridRunner

EXIT_INVALID, EXIT_FAILED, EXIT_LOCKED, EXIT_INTERRUPTED, EXIT_TERMINATED = 2, 1, 3, 130, 143
MAX_WORKERS, MAX_CPUS_PER_WORKER = 100_000, 1024  # beyond any cluster


class Terminated(KeyboardInterrupt):
    """SIGTERM (`ray job stop`, Slurm, Kubernetes): the run ends as on Ctrl-C."""


# Ray's wait turns the handler's Terminated into a plain KeyboardInterrupt: the flag says it was SIGTERM
SIGTERM_RECEIVED = threading.Event()


def _terminate(signum: int, frame: object) -> None:
    SIGTERM_RECEIVED.set()
    raise Terminated


class OneLineParser(argparse.ArgumentParser):
    """Refuses a bad argument in one line (exit 2), like a bad grid, instead of the usage text."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INVALID, f"{self.prog}: {message} (--help lists the options)\n")


def bounded(kind: type, low: float, high: float, *, low_allowed: bool = True) -> Callable[[str], float]:
    """An argparse type: a `kind` number from `low` (excluded unless `low_allowed`) to `high`."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not (low <= value if low_allowed else low < value) or not value <= high:
            what = "an integer" if kind is int else "a number"
            low_text = f"{low:g}" if low_allowed else f"{low:g} (excluded)"
            raise argparse.ArgumentTypeError(f"expected {what} from {low_text} to {high:g}, got {text!r}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="configs/embedded.yaml",
                        help="grid YAML file (default: %(default)s)")
    parser.add_argument("--out", default="results", help="results dataset directory (default: %(default)s)")
    parser.add_argument("--run", help="run name, the run=<name> partition (default: the grid's name)")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the grid and print work-unit counts only")
    parser.add_argument("--list", choices=KINDS,
                        help="print what a grid may name, built-in and the grid's own, one line each")
    parser.add_argument("--workers", type=bounded(int, 1, MAX_WORKERS),
                        help="number of actors (default: one per GPU, else one per CPU)")
    parser.add_argument("--gpus-per-worker", type=bounded(float, 0, MAX_GPUS_PER_WORKER),
                        help="GPUs per actor (default 1 with GPUs, else 0; a pair's gpus: sets its own)")
    parser.add_argument("--cpus-per-worker", type=bounded(float, 0, MAX_CPUS_PER_WORKER, low_allowed=False),
                        default=1,
                        help="CPUs per actor (default: %(default)s)")
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure latency ratios again even when the run added no rows "
                             "(grids with calibrate: true)")
    parser.add_argument("--no-compact", dest="compact", action="store_false",
                        help="leave the shard files as written (default: merged once the grid finishes)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.run is not None:
            check_name(args.run, "--run")
        spec = load_grid(args.grid, run_plugins=not (args.dry_run or args.list))
    except GridError as err:
        print(f"invalid grid {args.grid}: {err}", file=sys.stderr)
        if not args.list:
            return EXIT_INVALID
        spec = None  # the built-ins are listed all the same
    if args.list:
        from pipeline.planning.listing import listing

        print("\n".join(listing(args.list, spec)))
        return 0
    if args.dry_run:
        from pipeline.planning.shards import unit_counts

        print("\n".join(unit_counts(spec)))
        return 0
    from pipeline.planning.preflight import preflight

    source = RegistrySource.for_grid(spec)
    try:
        preflight(spec, args.out, source)
    except GridError as err:
        print(f"cannot run {args.grid}: {err}", file=sys.stderr)
        return EXIT_INVALID
    extension = extension_line(spec, args, source)
    if extension:
        print(extension, flush=True)
    return run(spec, args, source)


def extension_line(spec: GridSpec, args: argparse.Namespace, source: SampleSource) -> str | None:
    """What this grid adds to a run that already holds another one (pipeline.storage.manifest)."""
    from pipeline.planning.samples import RunSamples
    from pipeline.storage.manifest import extension_text, grid_record, run_grids
    from pipeline.storage.store import stored_config_keys

    run = args.run or spec.name
    record = grid_record(spec, RunSamples(spec, source, answers=lambda *_: {}).count)
    return extension_text(run, run_grids(args.out, run), stored_config_keys(args.out, run), record)


def run(spec: GridSpec, args: argparse.Namespace, source: SampleSource) -> int:
    """Hold the run's lock from before Ray starts: a second driver is refused at once."""
    from pipeline.storage.run_lock import RunLocked, run_lock

    try:
        with run_lock(args.out, args.run or spec.name):
            return run_locked(spec, args, source)
    except RunLocked as err:
        print(f"not started: {err}", file=sys.stderr)
        return EXIT_LOCKED
    except OSError as err:
        if err.errno not in UNWRITABLE:
            raise
        where = err.filename or Path(args.out).resolve()
        print(f"stopped: {UNWRITABLE[err.errno]}: could not write {where}; once it can be written, "
              "rerun the same command to resume (rows written so far are kept)", file=sys.stderr)
        return EXIT_FAILED


# Ray itself ends the driver 60 s after it lost the GCS (its reconnect timeout), printing nothing
# useful; a GCS restarting under fault tolerance is back well within this
GCS_SILENT_S = 45.0


def watch_gcs(resume: Callable[[], str], address: str | None = None, every_s: float = 5.0) -> threading.Event:
    """Watch the cluster's GCS from a thread until the returned event is set, and end the job
    with the line saying how to resume once the GCS has refused connections for `GCS_SILENT_S`:
    Ray's core worker would end the process a little later from C++, where no Python (no
    `except`, no `finally`) runs. The run lock stays behind, a dead driver's, which the rerun
    takes over. `address`: the GCS's host:port, by default the one this driver is connected to."""
    if address is None:
        import ray

        address = ray.get_runtime_context().gcs_address
    host, port = address.rsplit(":", 1)
    stop = threading.Event()

    def watch() -> None:
        silent_since = None
        while not stop.wait(every_s):
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                silent_since = None
            except OSError:
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since >= GCS_SILENT_S and not stop.is_set():
                    print(f"\nstopped: the Ray cluster's GCS at {address} stopped answering; once the "
                          f"cluster is back, {resume()}", file=sys.stderr, flush=True)
                    os._exit(EXIT_FAILED)

    threading.Thread(target=watch, name="gcs-watch", daemon=True).start()
    return stop


def stopped_by(stop: KeyboardInterrupt) -> tuple[str, int]:
    """("terminated", 143) after SIGTERM wherever the driver was when it came, ("interrupted",
    130) after Ctrl-C."""
    if isinstance(stop, Terminated) or SIGTERM_RECEIVED.is_set():
        return "terminated", EXIT_TERMINATED
    return "interrupted", EXIT_INTERRUPTED


def keep_token_private() -> None:
    """Ray writes the token that admits clients to its cluster (`~/.ray/auth_token`, or
    RAY_AUTH_TOKEN_PATH) with the default umask, readable by every user of the host: make it
    the owner's alone."""
    for name in {os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")} - {None}:
        token = Path(name)
        if token.is_file() and token.stat().st_uid == os.getuid() and token.stat().st_mode & 0o077:
            token.chmod(0o600)


def run_locked(spec: GridSpec, args: argparse.Namespace, source: SampleSource) -> int:
    """Start Ray, run the grid, summarise; every way it can end says what to do next."""
    import ray

    from actors.runner import GridRunner, RunFailed

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)  # workers log to files: the driver prints one line per shard
    else:  # "local": a new Ray for this job, even when some `ray start` cluster is running
        ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    keep_token_private()
    signal.signal(signal.SIGTERM, _terminate)  # after ray.init, whose own handler dumps a stack and aborts
    runner = GridRunner(
        spec, args.out, source=source, run=args.run, workers=args.workers,
        gpus_per_worker=args.gpus_per_worker, cpus_per_worker=args.cpus_per_worker,
    )

    def resume() -> str:
        return ("rerun the same command to resume "
                f"({runner.report.rows_written} rows written this time are kept)")

    watching = watch_gcs(resume)
    try:
        run_and_report(runner, spec, args)
    except KeyboardInterrupt as stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        how, code = stopped_by(stop)
        print(f"\n{how}; {resume()}", file=sys.stderr)
        return code
    except RunFailed as err:
        print(f"run {runner.run_name} stopped: {err}\nonce that is fixed, {resume()}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        watching.set()  # the job's own Ray may shut down now without this driver being ended
    return 0


def run_and_report(runner: "GridRunner", spec: GridSpec, args: argparse.Namespace) -> None:
    """The rows, the latency calibration (grids with `calibrate: true`), the run's files merged
    (a paper-scale run leaves tens of thousands, which every later read pays for), the report."""
    from actors.calibration import calibrate_pairs, grid_shapes, pairs_to_measure
    from pipeline.reports.report_inputs import read_inputs
    from pipeline.reports.summary import write_summary
    from pipeline.storage.compaction import compact_unless_full
    from pipeline.storage.store import report_dir

    report = runner.run()
    print(f"run {runner.run_name}: {report.rows_written} rows written in {report.shards_written} shards, "
          f"{report.rows_skipped} already present, {report.rows_recomputed} computed again, "
          f"{report.redispatched} re-dispatched, {report.seconds:.1f} s -> {Path(args.out).resolve()}")
    phases = {"decoding": report.seconds}
    if spec.calibrate:
        started = time.monotonic()
        shapes = grid_shapes(spec)
        pairs = pairs_to_measure([(p.target, p.draft, p.dtype) for p in spec.pairs], args.out, shapes=shapes,
                                 rows_written=report.rows_written, recalibrate=args.recalibrate)
        if pairs:
            calibrate_pairs(pairs, args.out, shapes=shapes, repeats=spec.calibrate_repeats,
                            rounds=spec.calibrate_rounds, ray_tasks=True, spread=spec.spread)
        phases["calibration"] = time.monotonic() - started
    if args.compact:  # under the lock this driver holds: nested, one lock
        started = time.monotonic()
        done, line = compact_unless_full(args.out, runner.run_name)
        print(line, file=sys.stdout if done else sys.stderr)
        phases["compaction"] = time.monotonic() - started
    started = time.monotonic()
    summary = write_summary(args.out, runner.run_name, read_inputs(args.out, runner.run_name))
    phases["report"] = time.monotonic() - started
    title, headline, *_ = summary.split("\n\n## ")  # the answer first; every table is in summary.md
    print(f"\n{title}\n\n## {headline}\n")
    print(f"tables and plots: {report_dir(args.out, runner.run_name).resolve()} (summary.md first)")
    total = time.monotonic() - STARTED
    phases = {"start-up": total - sum(phases.values()), **phases}
    print("time: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items())
          + f"; {total:.0f} s in all", flush=True)


if __name__ == "__main__":
    sys.exit(main())
