"""Where a live decode's walltime went, as shares of it: what the speedup table's `time split`
column says, so a speedup (or its absence) can be read off the parts that made it.

Parts, from each live row's phase timers: the target's and the draft's prefill (image features
and captions, `vision`, inside them), drafting, verifying, TABED's weight choice, mixing and
scoring (inside drafting and verifying), and the rest: the decode's wall clock less those
phases, i.e. tokenizing and host-side work between phases.
"""
from __future__ import annotations

import pandas as pd

PARTS = ("time_target_prefill_s", "time_draft_prefill_s", "time_vision_s", "time_draft_s", "time_verify_s",
         "time_tabed_s")


def time_shares(live: pd.DataFrame) -> dict[str, float] | None:
    """Mean share (percent of the wall clock) of each part over the live rows that have them."""
    if "time_wall_s" not in live:
        return None  # rows written before the split was recorded
    live = live.reindex(columns=[*live.columns, *(part for part in PARTS if part not in live)])
    timed = live.dropna(subset=["time_wall_s"])
    timed = timed[timed["time_wall_s"] > 0]
    if timed.empty:
        return None
    shares = {part: (100 * timed[part].fillna(0) / timed["time_wall_s"]).mean() for part in PARTS}
    inside = timed["time_target_prefill_s"].fillna(0) + timed["time_draft_prefill_s"].fillna(0) \
        + timed["time_draft_s"].fillna(0) + timed["time_verify_s"].fillna(0)
    shares["rest"] = (100 * (timed["time_wall_s"] - inside) / timed["time_wall_s"]).mean()
    return shares


def time_split_text(live: pd.DataFrame) -> str:
    """`prefill 12+3 (vision 1) · draft 30 · verify 48 · TABED 2 · rest 7` (% of wall), or ''."""
    shares = time_shares(live)
    if shares is None:
        return ""
    pct = {name: f"{value:.0f}" for name, value in shares.items()}
    prefill = (pct["time_target_prefill_s"]
               + (f"+{pct['time_draft_prefill_s']}" if shares["time_draft_prefill_s"] else ""))
    return (f"prefill {prefill} (vision {pct['time_vision_s']}) · draft {pct['time_draft_s']} · verify "
            f"{pct['time_verify_s']} · TABED {pct['time_tabed_s']} · rest {pct['rest']}")
