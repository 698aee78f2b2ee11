"""Calibrations on disk: one file per pair and dtype in `OUT/_calibration/` (the underscore
keeps pyarrow's dataset discovery of the decoding results away from them), read back once into
`Calibrations`, which picks the one a report uses and draws its tables. No torch here: reports
read calibrations without the models (`pipeline.decoding.step_costs` measures them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

from pipeline.decoding.calibration import Calibration
from pipeline.storage.atomic import set_aside, write_atomically

CALIBRATION_DIR = "_calibration"


def calibration_path(out: str | Path, target: str, draft: str, dtype: str) -> Path:
    safe = lambda name: name.replace("/", "__").replace(":", "_")
    return Path(out) / CALIBRATION_DIR / f"{safe(target)}--{safe(draft)}--{safe(dtype)}.parquet"


def write_calibration(out: str | Path, calibration: Calibration) -> Path:
    """One file per pair and dtype, replaced atomically (`write_atomically`): measuring again
    (other hardware, `--recalibrate`) overwrites it."""
    path = calibration_path(out, calibration.target, calibration.draft, calibration.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda sink: pd.DataFrame([calibration.to_row()]).to_parquet(sink, index=False))
    return path


def read_calibrations(out: str | Path) -> Calibrations:
    """Every calibration under OUT, each file through `Calibration.from_row` (none: empty). A
    file that cannot be read (truncated, not Parquet, missing fields) is set aside and left out,
    so its pair is calibrated again by the next run that calibrates, instead of ending every
    report and rerun."""
    calibrations = []
    for path in sorted((Path(out) / CALIBRATION_DIR).glob("*.parquet")):
        try:
            calibrations += [Calibration.from_row(row) for row in pd.read_parquet(path).to_dict("records")]
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as err:
            set_aside(path, err, "its pair is calibrated again by the next run that calibrates")
    return Calibrations(calibrations)


@dataclass
class Calibrations:
    """The calibrations of a results folder: the latest of each pair and dtype is the one
    reports use (`latest`, `used`), and the tables they show."""

    all: list[Calibration]

    @property
    def empty(self) -> bool:
        return not self.all

    def latest(self, target: str, draft: str, dtype: str) -> Calibration | None:
        """The latest calibration of a pair in a dtype, or None."""
        mine = [c for c in self.all if (c.target, c.draft, c.dtype) == (target, draft, dtype)]
        return max(mine, key=lambda c: c.measured_at, default=None)

    @property
    def used(self) -> list[Calibration]:
        """The calibration reports use for each pair and dtype, in first-seen order."""
        pairs = dict.fromkeys((c.target, c.draft, c.dtype) for c in self.all)
        return [self.latest(*pair) for pair in pairs]

    def table(self) -> pd.DataFrame:
        """One line per pair and dtype, the calibration reports use: ratios as median [min-max]
        over rounds, and when, where, how and under what load it was measured."""
        lines = [
            {"target": c.target, "draft": c.draft, "dtype": c.dtype, "device": c.where,
             "engine": c.engine, "gamma": c.gamma,
             "Tq/Tp": _spread(c.ratio_draft_target, c.ratio_draft_target_rounds, "(one measurement)"),
             "Tp(gamma+1)/Tp": _spread(c.ratio_verify, c.ratio_verify_rounds, "(one measurement)"),
             "Tp(n)/Tp by n": ", ".join(f"{n}: {_spread(c.verify_ratio(n), c.verify_rounds(n))}"
                                        for n in sorted(c.verify_tokens)),
             "Tp ms": round(1e3 * c.target_token_s, 2), "Tq ms": round(1e3 * c.draft_token_s, 2),
             "rounds x repeats": f"{c.rounds} x {c.repeats}", "load": _load(c),
             "measured at": c.measured_at or "-"}
            for c in self.used
        ]
        return pd.DataFrame(lines).set_index(["target", "draft", "dtype"]) if lines else pd.DataFrame()

    def verify_curves(self) -> pd.DataFrame:
        """The verify-latency curve of every target, dtype and device: one row per token count n
        with Tp(n)/Tp(1) (the median) and its lowest and highest round, from the latest
        calibration of each (the target's, whatever the draft)."""
        latest: dict[tuple, Calibration] = {}
        for c in sorted(self.all, key=lambda c: c.measured_at):
            latest.pop((c.target, c.dtype, c.where), None)
            latest[(c.target, c.dtype, c.where)] = c
        rows = []
        for (target, dtype, where), c in latest.items():
            mine = {"target": target, "dtype": dtype, "device": where}
            rows.append(mine | {"tokens": 1, "ratio": 1.0, "low": 1.0, "high": 1.0})
            for n in sorted(c.verify_tokens):
                rounds = c.verify_rounds(n) or [math.nan]
                rows.append(mine | {"tokens": n, "ratio": c.verify_ratio(n), "low": min(rounds),
                                    "high": max(rounds)})
        return pd.DataFrame(rows, columns=["target", "dtype", "device", "tokens", "ratio", "low", "high"])

    def context_costs(self) -> pd.DataFrame:
        """One draft and one target step after prompts of several lengths, per pair (the latest
        calibration of each): how each model's step cost grows with the context."""
        return pd.DataFrame([
            {"target": c.target, "draft": c.draft, "dtype": c.dtype, "device": c.where, "context": tokens,
             "Tp ms": round(1e3 * target_s, 3), "Tq ms": round(1e3 * draft_s, 3),
             "Tq/Tp": round(draft_s / target_s, 4)}
            for c in self.used
            for tokens, target_s, draft_s in zip(c.context_tokens, c.context_target_s, c.context_draft_s)
        ])


def _spread(value: float, rounds: list[float], alone: str = "") -> str:
    """`value [min-max]` over rounds; `value alone` when there was one round."""
    if len(rounds) > 1:
        return f"{value:.3f} [{min(rounds):.3f}-{max(rounds):.3f}]"
    return f"{value:.3f}" + (f" {alone}" if alone else "")


def _load(calibration: Calibration) -> str:
    """The machine's 1-minute load average before -> after measuring, on its cores."""
    before, after, cores = calibration.load_before, calibration.load_after, calibration.cpu_cores
    if before is None or after is None or cores is None:
        return "-"
    return f"{before:.1f} -> {after:.1f} on {cores} cores"
