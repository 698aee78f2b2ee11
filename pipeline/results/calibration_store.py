"""Calibrations on disk: one file per pair and dtype in `OUT/_calibration/` (the underscore
keeps pyarrow's dataset discovery of the decoding results away from them), the choice of the
one a report uses, and its summary table. No torch here: reports read calibrations without
the models (`pipeline.results.calibration` measures them).
"""
from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

CALIBRATION_DIR = "_calibration"


def calibration_path(out: str | Path, target: str, draft: str, dtype: str) -> Path:
    safe = lambda name: name.replace("/", "__").replace(":", "_")
    return Path(out) / CALIBRATION_DIR / f"{safe(target)}--{safe(draft)}--{safe(dtype)}.parquet"


def write_calibration(out: str | Path, calibration: Any) -> Path:
    """One file per pair and dtype (a `Calibration`), replaced atomically: measuring again
    (other hardware, `--recalibrate`) overwrites it."""
    path = calibration_path(out, calibration.target, calibration.draft, calibration.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    row = asdict(calibration) | {
        "ratio_draft_target": calibration.ratio_draft_target,
        "ratio_verify": calibration.ratio_verify,
    }
    tmp = path.with_name("." + path.name)
    pd.DataFrame([row]).to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def read_calibrations(out: str | Path) -> pd.DataFrame:
    """Every calibration under OUT (empty frame when none was run)."""
    files = sorted((Path(out) / CALIBRATION_DIR).glob("*.parquet"))
    if not files:
        return pd.DataFrame()
    table = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    for column, default in (("measured_at", ""), ("rounds", 1), ("device_name", "")):  # files from before these
        table[column] = table[column].fillna(default) if column in table else default
    return table


def stored_calibration(calibrations: pd.DataFrame, target: str, draft: str, dtype: str) -> pd.Series | None:
    """The latest calibration of a pair in a dtype, or None."""
    if calibrations.empty:
        return None
    match = (calibrations["target"] == target) & (calibrations["draft"] == draft) & (calibrations["dtype"] == dtype)
    found = calibrations[match].sort_values("measured_at")
    return None if found.empty else found.iloc[-1]


def listed(value: Any) -> list:
    """A stored list column as a list ([] where a file from before it holds a null)."""
    return [] if value is None or isinstance(value, float) else list(value)


def verify_ratio(calibration: pd.Series, tokens: int) -> float:
    """Tp(tokens)/Tp(1): one target forward over `tokens` tokens against one cached step, from
    the calibration's verify-latency curve; NaN when that token count was not measured (files
    from before the curve hold only gamma + 1)."""
    measured = listed(calibration.get("verify_tokens"))
    if tokens in measured:
        return float(listed(calibration["verify_ratios"])[measured.index(tokens)])
    return float(calibration["ratio_verify"]) if tokens == int(calibration["gamma"]) + 1 else math.nan


def measured_verify_tokens(calibration: pd.Series) -> set[int]:
    """The token counts whose verify cost a calibration measured."""
    return set(listed(calibration.get("verify_tokens"))) or {int(calibration["gamma"]) + 1}


def draft_rows_ratio(calibration: pd.Series, rows: int) -> float:
    """Tq with `rows` rows in the draft batch over Tp (an m-method ensemble drafts m rows, a
    candidate tree one group of them per branch); NaN when that batch was not timed."""
    ratios = listed(calibration.get("draft_rows_ratio"))
    counts = listed(calibration.get("draft_row_counts")) or list(range(1, len(ratios) + 1))
    if ratios:
        return float(ratios[counts.index(rows)]) if rows in counts else math.nan
    times = list(calibration["draft_rows_token_s"])  # files from before rounds were kept
    return times[rows - 1] / calibration["target_token_s"] if rows <= len(times) else math.nan


def draft_target_rounds(calibration: pd.Series) -> list[float]:
    """Tq/Tp of every round."""
    return [float(r) for r in listed(calibration.get("ratio_draft_target_rounds"))]


def verify_rounds(calibration: pd.Series, tokens: int) -> list[float]:
    """Tp(tokens)/Tp of every round ([] when not kept: files from before every round was)."""
    measured, rounds = listed(calibration.get("verify_tokens")), listed(calibration.get("verify_ratio_rounds"))
    if tokens in measured and rounds:
        return [float(r) for r in rounds[measured.index(tokens)]]
    at_gamma = tokens == int(calibration["gamma"]) + 1
    return [float(r) for r in listed(calibration.get("ratio_verify_rounds"))] if at_gamma else []


def draft_rows_rounds(calibration: pd.Series, rows: int) -> list[float]:
    """Tq(rows)/Tp of every round ([] when not kept)."""
    counts, rounds = listed(calibration.get("draft_row_counts")), listed(calibration.get("draft_rows_ratio_rounds"))
    return [float(r) for r in rounds[counts.index(rows)]] if rows in counts and rounds else []


def measured_draft_rows(calibration: pd.Series) -> set[int]:
    """The draft batch sizes a calibration timed."""
    ratios = listed(calibration.get("draft_rows_ratio")) or listed(calibration.get("draft_rows_token_s"))
    return set(listed(calibration.get("draft_row_counts")) or range(1, len(ratios) + 1))


def context_costs(calibrations: pd.DataFrame) -> pd.DataFrame:
    """One draft and one target step after prompts of several lengths, per pair (the latest
    calibration of each): how each model's step cost grows with the context."""
    rows = []
    for c in used_calibrations(calibrations):
        for tokens, target_s, draft_s in zip(*(listed(c.get(k)) for k in ("context_tokens", "context_target_s",
                                                                            "context_draft_s"))):
            rows.append({"target": c["target"], "draft": c["draft"], "dtype": c["dtype"], "device": _device(c),
                         "context": int(tokens), "Tp ms": round(1e3 * target_s, 3), "Tq ms": round(1e3 * draft_s, 3),
                         "Tq/Tp": round(draft_s / target_s, 4)})
    return pd.DataFrame(rows)


def verify_curves(calibrations: pd.DataFrame) -> pd.DataFrame:
    """The verify-latency curve of every target, dtype and device: one row per token count n
    with Tp(n)/Tp(1) (the median) and its lowest and highest round, from the latest
    calibration of each (the target's, whatever the draft)."""
    if calibrations.empty:
        return pd.DataFrame(columns=["target", "dtype", "device", "tokens", "ratio", "low", "high"])
    latest = calibrations.sort_values("measured_at").copy()
    latest["where"] = [_device(c) for _, c in latest.iterrows()]
    rows = []
    for _, c in latest.drop_duplicates(["target", "dtype", "where"], keep="last").iterrows():
        where = {"target": c["target"], "dtype": c["dtype"], "device": c["where"]}
        rows.append(where | {"tokens": 1, "ratio": 1.0, "low": 1.0, "high": 1.0})
        for n in sorted(measured_verify_tokens(c)):
            rounds = verify_rounds(c, n) or [math.nan]
            rows.append(where | {"tokens": n, "ratio": verify_ratio(c, n), "low": min(rounds), "high": max(rounds)})
    return pd.DataFrame(rows)


def _device(calibration: pd.Series) -> str:
    """Where it was measured: the device's name (e.g. the GPU model), else `cpu`/`cuda:0` for
    files from before names were kept."""
    return calibration.get("device_name") or calibration["device"]


def _spread_of(value: float, rounds: list[float]) -> str:
    return f"{value:.3f}" + (f" [{min(rounds):.3f}-{max(rounds):.3f}]" if len(rounds) > 1 else "")


def _spread(calibration: pd.Series, name: str) -> str:
    rounds = calibration.get(f"{name}_rounds")
    value = f"{calibration[name]:.3f}"
    if rounds is None or len(rounds) < 2:
        return f"{value} (one measurement)"
    return f"{value} [{min(rounds):.3f}-{max(rounds):.3f}]"


def used_calibrations(calibrations: pd.DataFrame) -> list[pd.Series]:
    """The calibration reports use for each pair and dtype (`stored_calibration`)."""
    if calibrations.empty:
        return []
    keys = calibrations[["target", "draft", "dtype"]].drop_duplicates().itertuples(index=False)
    return [stored_calibration(calibrations, *key) for key in keys]


def _load(calibration: pd.Series) -> str:
    """The machine's 1-minute load average before -> after measuring, on its cores."""
    before, after, cores = (calibration.get(c) for c in ("load_before", "load_after", "cpu_cores"))
    if any(v is None or pd.isna(v) for v in (before, after, cores)):
        return "-"
    return f"{before:.1f} -> {after:.1f} on {int(cores)} cores"


def calibration_table(calibrations: pd.DataFrame) -> pd.DataFrame:
    """One line per pair and dtype, the calibration reports use (`stored_calibration`): ratios
    as median [min-max] over rounds, and when, where, how and under what load it was measured."""
    used = used_calibrations(calibrations)
    if not used:
        return pd.DataFrame()
    lines = [
        {"target": c["target"], "draft": c["draft"], "dtype": c["dtype"], "device": _device(c),
         "engine": c.get("engine", "-"), "gamma": int(c["gamma"]), "Tq/Tp": _spread(c, "ratio_draft_target"),
         "Tp(gamma+1)/Tp": _spread(c, "ratio_verify"),
         "Tp(n)/Tp by n": ", ".join(f"{n}: {_spread_of(verify_ratio(c, n), verify_rounds(c, n))}"
                                    for n in sorted(measured_verify_tokens(c))),
         "Tp ms": round(1e3 * c["target_token_s"], 2), "Tq ms": round(1e3 * c["draft_token_s"], 2),
         "rounds x repeats": f"{int(c['rounds'])} x {int(c['repeats'])}", "load": _load(c),
         "measured at": c["measured_at"] or "-"}
        for c in used
    ]
    return pd.DataFrame(lines).set_index(["target", "draft", "dtype"])
