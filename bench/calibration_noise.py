"""How far a calibration's rounds spread on a quiet machine and on a loaded one: the data behind
the spread limit of `pipeline.reports.noise` (a ratio whose rounds spread further is reported
as unreliable).

    python bench/calibration_noise.py                   # the embedded pair, 3 calibrations quiet, 3 loaded
    python bench/calibration_noise.py --busy 6 --runs 2

Each calibration is the default job's (both cores as threads, 5 rounds of 10 steps, the
chain's and both candidate trees' shapes). "Loaded" runs `--busy` processes spinning on the
CPU beside it, as other jobs on a shared machine would. Output, `name=value`, per condition
(`quiet`, `loaded`) and calibration `k`, for each ratio (`tq_rows_1` is Tq/Tp, `tq_rows_4` the
4-row draft batch, `tp_6` the 6-token verify): `<condition>_<k>_<ratio>_spread` (what the
report judges: (max - min) / median of the middle rounds), `_full_spread` (every round),
`_rounds`; `<condition>_<k>_load` (the highest 1-minute load average around it); then
`<condition>_widest_spread`, `<condition>_narrowest_widest_spread` (over calibrations: the
widest ratio of the least noisy one), `cores`.
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain copy of the repo

from pipeline.decoding.step_costs import calibrate  # noqa: E402
from pipeline.models.devices import cpu_cores  # noqa: E402
from pipeline.reports.noise import Spread  # noqa: E402


def spin() -> None:
    while True:
        sum(i * i for i in range(10_000))


def spreads(result) -> dict[str, Spread]:
    """Each ratio's rounds."""
    found = {f"tq_rows_{rows}": Spread("rows", tuple(rounds))
             for rows, rounds in zip(result.draft_row_counts, result.draft_rows_ratio_rounds)}
    found |= {f"tp_{tokens}": Spread("verify", tuple(rounds))
              for tokens, rounds in zip(result.verify_tokens, result.verify_ratio_rounds)}
    return found


def full_spread(spread: Spread) -> float:
    """(max - min) / median over every round, the stray ones included."""
    middle = sorted(spread.rounds)[len(spread.rounds) // 2]
    return (max(spread.rounds) - min(spread.rounds)) / middle


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="calibrations per condition")
    parser.add_argument("--busy", type=int, default=4, help="spinning processes in the loaded condition")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    from pipeline.models.embedded import load_embedded

    torch.set_num_threads(args.threads)
    target, draft = load_embedded("target"), load_embedded("small_draft")
    print(f"cores={cpu_cores()}")
    widest: dict[str, list[float]] = {}
    for condition in ("quiet", "loaded"):
        busy = [multiprocessing.Process(target=spin, daemon=True)
                for _ in range(args.busy if condition == "loaded" else 0)]
        for process in busy:
            process.start()
        time.sleep(20 if busy else 0)  # let the load average see them
        for k in range(args.runs):
            result = calibrate(target, draft, gammas=(5,), verify_tokens=(16, 26), draft_rows=(6, 20))
            found = spreads(result)
            for name, spread in found.items():
                print(f"{condition}_{k}_{name}_spread={spread.relative:.3f}", flush=True)
                print(f"{condition}_{k}_{name}_full_spread={full_spread(spread):.3f}", flush=True)
                print(f"{condition}_{k}_{name}_rounds={','.join(f'{r:.4f}' for r in spread.rounds)}",
                      flush=True)
            print(f"{condition}_{k}_load={max(result.load_before, result.load_after):.2f}", flush=True)
            widest.setdefault(condition, []).append(max(spread.relative for spread in found.values()))
        for process in busy:
            process.terminate()
        print(f"{condition}_widest_spread={max(widest[condition]):.3f}")
        print(f"{condition}_narrowest_widest_spread={min(widest[condition]):.3f}")


if __name__ == "__main__":
    main()
