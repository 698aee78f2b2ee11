"""Write a run's rows in another tool's format (pipeline.reports.export).

    python jobs/export.py results --format spec-bench [--run embedded] [--to DIR]
    python jobs/export.py results --format mmspec
    python jobs/export.py results --format speculation-profile

Spec-Bench: per pair, one `model_answer` JSONL per drafting configuration and one baseline of
the target alone (AR) on the same questions, under `OUT/_export-<run>/spec-bench/` by default,
and the tokenizer Spec-Bench's `speed()` must load for each target (docs/cluster.md, "Acceptance
you can compare", has the calls on each tool's side). MMSpec: per pair a folder of
`<label>-temperature-<t>.jsonl` and `baseline-temperature-<t>.jsonl` (`0` for greedy) for its
`evaluation/summarize_metrics.py`. Speculation profile: one `speculation_profile.json` (schema
1.0 of NVIDIA's specdec_bench) per configuration, replayed rows included.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.reports.export import FORMATS, export  # noqa: E402
from pipeline.storage.store import export_dir, read_results, run_names  # noqa: E402


def tokenizer_path(target: str) -> str:
    """What Spec-Bench's `speed()` loads with `AutoTokenizer.from_pretrained` to count the
    baseline's tokens: the embedded models' converted checkpoint, else the target's own id."""
    if target.startswith("embedded:"):
        from pipeline.models.embedded_parts.language import converted_dir

        return str(converted_dir())
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="results directory written by jobs/full_grid.py")
    parser.add_argument("--format", choices=FORMATS, default="spec-bench")
    parser.add_argument("--run", help="only this run (default: every run under the directory)")
    parser.add_argument("--to", help="folder to write (default: OUT/_export-<run>/<format>)")
    args = parser.parse_args(argv)
    runs = [args.run] if args.run else run_names(args.out)
    if not runs:
        print(f"no results under {args.out}", file=sys.stderr)
        return 1
    for run in runs:
        folder = Path(args.to) if args.to else export_dir(args.out, run, args.format)
        rows = read_results(args.out, run)
        written = export(rows, folder, args.format)
        empty = (" (no speculative rows with accepted counts)" if args.format == "speculation-profile"
                 else " (no live rows: only decodes with a walltime are exported)")
        print(f"run {run}: {len(written)} file(s) in {folder.resolve()}" + ("" if written else empty))
        if written and args.format == "spec-bench":
            for target in sorted(set(rows["target"])):
                print(f"  tokenizer for Spec-Bench's speed() with target {target}: {tokenizer_path(target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
