"""Measure draft/target latency ratios for every model pair of a grid (or one pair).

    python jobs/calibrate.py --grid configs/embedded.yaml --out results/embedded
    python jobs/calibrate.py --target llava-hf/llava-1.5-7b-hf --draft mjbooo/lvlm68m --out DIR --ray
    python jobs/calibrate.py --grid configs/embedded.yaml --out DIR --gamma 3 5   # other gammas

With --ray each pair is measured in a Ray task holding one GPU (on the hardware the grid runs
on); without it, on this machine's device. A line per round says how far it is; at the end the
report of every run under --out with rows of a calibrated pair is written again. Each measurement
is repeated in --rounds rounds (target and draft alternating) and the report gives the median and
range of the ratios. The verify cost is measured for gamma + 1 tokens of every gamma and for
every token tree's nodes + 1 (a grid's: all of them), and the draft step for every draft batch
its blocks use.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.calibration import (  # noqa: E402
    CONTEXTS, REPEATS, ROUNDS, Shapes, calibrate_pairs, grid_shapes, rewrite_reports,
)
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.planning.grid_file import load_grid  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", help="grid YAML: calibrate each of its (target, draft, dtype) pairs")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--out", required=True, help="results directory to write _calibration/ into")
    parser.add_argument("--gamma", type=int, nargs="+",
                        help="draft lengths whose verify cost (gamma + 1 tokens) to measure "
                             f"(default: the grid's, else {DecodeConfig.gamma})")
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help="timed steps per measurement (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds, target and draft alternating (default: %(default)s)")
    parser.add_argument("--contexts", type=int, nargs="*", default=list(CONTEXTS),
                        help="prompt lengths to time one draft and target step at "
                             "(default: %(default)s; none: skip)")
    parser.add_argument("--batch", type=int, nargs="*", default=None,
                        help="batch sizes to time the same steps at (default: the grid's, else none)")
    parser.add_argument("--ray", action="store_true", help="measure each pair in a Ray task with one GPU")
    args = parser.parse_args(argv)
    shapes = Shapes(tuple(args.gamma or (DecodeConfig.gamma,)))
    if args.grid:
        spec = load_grid(args.grid)
        pairs = [(p.target, p.draft, p.dtype) for p in spec.pairs]
        shapes = (grid_shapes(spec) if args.gamma is None
                  else replace(grid_shapes(spec), gammas=tuple(args.gamma)))
    elif args.target and args.draft:
        pairs = [(args.target, args.draft, args.dtype)]
    else:
        parser.error("give --grid, or --target and --draft")
    shapes = replace(shapes, contexts=tuple(args.contexts))
    if args.batch is not None:
        shapes = replace(shapes, batches=tuple(sorted(set(args.batch) - {1})))
    if args.ray:
        import ray

        ray.init(address="auto")
    calibrate_pairs(pairs, args.out, shapes=shapes, repeats=args.repeats, rounds=args.rounds,
                    ray_tasks=args.ray)
    rewrite_reports(args.out, pairs)


if __name__ == "__main__":
    main()
