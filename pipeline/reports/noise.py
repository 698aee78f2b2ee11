"""When a measured figure is noise rather than a result: a latency ratio whose rounds disagree,
or a walltime taken while the machine had more runnable threads than cores. Reports print such
figures as `unreliable`, with the spread or the load, instead of as findings.

The spread limit comes from `bench/calibration_noise.py` on this project's 2-core CI machine
(docs/cluster.md, "Measurement noise"): on a quiet machine the middle rounds of every ratio of
four calibrations spread by at most 6% of their median; with four processes competing for the
two cores, every calibration had ratios spreading by 64% to 470%, and 24 of 36 ratios by over 25%.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from pipeline.decoding.calibration import Calibration
from pipeline.storage.calibration_store import Calibrations

# (max - min) / median of a ratio's middle rounds beyond which the ratio, and every figure
# computed from it, is unreliable
SPREAD_LIMIT = 0.25
UNRELIABLE = "unreliable"
LOAD_COLUMNS = ("load_before", "load_after")


@dataclass(frozen=True)
class Spread:
    """A latency ratio's rounds. Judged on the middle ones: with four rounds or more the lowest
    and highest are left out, since one stray round (a page fault, another process waking)
    barely moves the median that reports use, while rounds that disagree throughout do."""

    name: str
    rounds: tuple[float, ...]

    @property
    def middle(self) -> list[float]:
        ordered = sorted(self.rounds)
        return ordered[1:-1] if len(ordered) >= 4 else ordered

    @property
    def relative(self) -> float:
        """(max - min) / median of the middle rounds; NaN with fewer than two rounds."""
        if len(self.rounds) < 2:
            return math.nan
        middle = float(pd.Series(self.rounds).median())
        return (max(self.middle) - min(self.middle)) / middle if middle > 0 else math.inf

    @property
    def noisy(self) -> bool:
        return self.relative > SPREAD_LIMIT  # False for NaN

    def __str__(self) -> str:
        shown = " ".join(f"{r:.3f}" for r in sorted(self.rounds))
        return f"{self.name} rounds {shown} (middle rounds spread {self.relative:.0%} of the median)"


@dataclass(frozen=True)
class Load:
    """The highest 1-minute load average read around some timing, and the machine's cores."""

    peak: float
    cores: int

    @property
    def noisy(self) -> bool:
        return self.peak > self.cores

    def __str__(self) -> str:
        return f"load {self.peak:.1f} on {self.cores} cores"


def ratio_spreads(calibration: Calibration, draft_rows: int, verify_tokens: int) -> dict[str, list[Spread]]:
    """The spreads each expected speedup rests on: Eq. 1 on Tq/Tp, its corrected form on the
    draft batch's Tq(m rows)/Tp and the verify forward's Tp(n)/Tp (rounds not kept: none)."""
    spread = lambda name, rounds: [Spread(name, tuple(rounds))] if rounds else []
    return {
        "eq1": spread("Tq/Tp", calibration.ratio_draft_target_rounds),
        "corrected": spread("Tq/Tp" if draft_rows == 1 else f"Tq({draft_rows} rows)/Tp",
                            calibration.draft_rounds(draft_rows))
        + spread(f"Tp({verify_tokens})/Tp", calibration.verify_rounds(verify_tokens)),
    }


def calibration_load(calibration: Calibration) -> Load | None:
    """The load while a calibration measured (None for files from before it was kept)."""
    loads = [v for v in (calibration.load_before, calibration.load_after) if v is not None]
    return Load(max(loads), calibration.cpu_cores) if loads and calibration.cpu_cores is not None else None


def rows_load(rows: pd.DataFrame) -> Load | None:
    """The load around the decodes of some live rows (None where rows do not record it)."""
    if rows.empty or any(c not in rows for c in (*LOAD_COLUMNS, "cpu_cores")):
        return None
    peaks = rows[list(LOAD_COLUMNS)].max(axis=1).dropna()
    cores = rows.loc[peaks.index, "cpu_cores"].dropna()
    if peaks.empty or cores.empty:
        return None
    return Load(float(peaks.max()), int(cores.min()))


def noise_text(flags: dict[str, list]) -> str:
    """`column, column: why; column: why` for the columns whose figures are unreliable,
    columns with the same reason named together."""
    columns: dict[str, list[str]] = {}
    for column, why in flags.items():
        if why:
            columns.setdefault(" and ".join(map(str, why)), []).append(column)
    return "; ".join(f"{', '.join(names)}: {why}" for why, names in columns.items())


def noise_parts(text: str) -> dict[str, str]:
    """A `noise_text` back as column -> why."""
    if not isinstance(text, str):
        return {}
    parts = [part.split(": ", 1) for part in text.split("; ") if ": " in part]
    return {column: why for names, why in parts for column in names.split(", ")}


def flagged_columns(text: str) -> set[str]:
    """The columns a `noise_text` names."""
    return set(noise_parts(text))


def shown(table: pd.DataFrame, noise: str = "noise") -> pd.DataFrame:
    """`table` for reading: each figure its row's `noise` flags printed as `unreliable`."""
    if noise not in table or not table[noise].fillna("").astype(bool).any():
        return table
    display = table.astype({c: object for c in table.columns if c != noise})
    for i, text in enumerate(table[noise]):
        for column in flagged_columns(text) & set(table.columns):
            display.iloc[i, display.columns.get_loc(column)] = UNRELIABLE
    return display


def calibration_spreads(calibration: Calibration) -> list[Spread]:
    """Every ratio a calibration measured, as spreads: Tq/Tp, the draft batches, the verify curve."""
    spreads = [Spread("Tq/Tp", tuple(calibration.ratio_draft_target_rounds))]
    spreads += [Spread(f"Tq({m} rows)/Tp", tuple(calibration.draft_rounds(m)))
                for m in calibration.draft_row_counts if m > 1]
    spreads += [Spread(f"Tp({n})/Tp", tuple(calibration.verify_rounds(n))) for n in calibration.verify_tokens]
    return [s for s in spreads if s.rounds]


def noise_section(calibrations: Calibrations, timed: pd.DataFrame, speedup: pd.DataFrame) -> str:
    """The summary's account of measurement noise: the limits, then each calibration the tables
    drew (`calibrations.used`) and each pair's timed decodes that broke them, or the widest
    spread and highest load seen when none did; `timed`: the live and AR rows of timed samples."""
    lines = ["A latency ratio is unreliable when its middle rounds (all but the lowest and the highest) "
             f"spread over more than {SPREAD_LIMIT:.0%} of their median, and so is every expected speedup "
             "computed from it; a walltime is unreliable when the machine's 1-minute load average, read "
             "before and after each timed decode, exceeded its cores. The tables above print such figures "
             f"as `{UNRELIABLE}` and say why in their `noise` column."]
    spreads, loads = [], []  # (spread, whose) and (load, whose) of everything judged
    for calibration in calibrations.used:
        pair = f"{calibration.target} <- {calibration.draft} ({calibration.dtype})"
        mine, load = calibration_spreads(calibration), calibration_load(calibration)
        spreads += [(s, f"{s.name} of {pair}") for s in mine if not math.isnan(s.relative)]
        found = ([str(s) for s in mine if s.noisy]
                 + ([f"{load} while it measured"] if load and load.noisy else []))
        if found:
            lines.append(f"- **Calibration of {pair}**: " + "; ".join(found) + ".")
    for (target, draft, dtype), rows in timed.groupby(["target", "draft", "dtype"]) if len(timed) else []:
        load = rows_load(rows)
        if load is not None:
            loads.append(load)
            if load.noisy:
                lines.append(f"- **Timed decodes of {target} <- {draft} ({dtype})**: {load} around them; "
                             "their measured speedups are unreliable.")
    flagged = int(speedup["noise"].fillna("").astype(bool).sum()) if "noise" in speedup else 0
    if len(lines) > 1 or flagged:
        found = "\n".join(lines[1:])
        if flagged:
            advice = (f"**{flagged} row(s) of the speedup table hold unreliable figures.** Measure again on "
                      "a quiet machine: `python jobs/calibrate.py --grid GRID --out OUT` measures the "
                      "ratios again and rewrites this report; walltimes need the timed samples decoded "
                      "again (a new `--run`).")
        else:
            advice = ("The load exceeded the cores (above), yet every ratio's middle rounds stayed within "
                      "the limit: the figures are printed, with this warning. A calibration running on every "
                      "core itself holds the load near the core count, so a few tenths above it can come "
                      "from Ray's own processes.")
        return "## Measurement noise\n\n" + "\n\n".join(filter(None, (lines[0], found, advice)))
    seen = []
    if spreads:
        spread, whose = max(spreads, key=lambda found: found[0].relative)
        seen.append(f"the widest spread of a ratio's rounds was {spread.relative:.0%} "
                    f"of its median ({whose})")
    if loads:
        peak = max(loads, key=lambda load: load.peak)
        seen.append(f"the load around timed decodes peaked at {peak.peak:.1f} on {peak.cores} cores")
    quiet = "No figure is flagged" + (": " + "; ".join(seen) if seen else "") + "."
    return f"## Measurement noise\n\n{lines[0]}\n\n{quiet}"
