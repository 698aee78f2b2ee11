"""Replay fidelity: do trace-replayed rows say what live decoding says?

Most greedy rows of a run are scored by trace replay (`pipeline.decoding.replay`), which is
exact in exact arithmetic. Every live greedy speculative row also carries the accepted counts
replay gives the same configuration and sample (`replay_accepted_per_block`, computed by the
worker beside the live decode), so a run measures how far replay can be trusted on its own
models and dtype instead of assuming it.
"""
from __future__ import annotations

import pandas as pd

from pipeline.models.lookup_names import replays

GROUP_KEYS = ["target", "draft", "dtype", "engine"]
COLUMNS = GROUP_KEYS + ["live rows", "checked", "identical", "rate %", "mean abs dtau", "max abs dtau"]
NEAR_TIE_NOTE = (
    "Replay scores teacher-forced forwards of all drafting methods in one batch, live decoding "
    "sees the same positions in other shapes, so logits differ by rounding (about 1e-5 in fp32, "
    "far more in bf16) and a near-tie can accept one more or one fewer token. Tau of the "
    "replay-scored rows of these groups carries that uncertainty."
)


def _tau(accepted) -> float:
    return 1.0 + sum(accepted) / len(accepted) if len(accepted) else float("nan")


def fidelity_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The live greedy speculative rows that decoded, with `checked` (replay counts present),
    `identical` (same accepted count in every block) and `dtau` (|tau live - tau replay|). A
    head's rows, and a lookup's beyond chains, are left out: replay never scores them
    (`pipeline.models.lookup_names.replays`)."""
    if "replay_accepted_per_block" not in rows.columns:
        rows = rows.assign(replay_accepted_per_block=None)
    kinds = rows["verify_kind"] if "verify_kind" in rows.columns else pd.Series("chain", index=rows.index)
    heads = ~pd.Series([replays(str(d), k == "chain") for d, k in zip(rows["draft"], kinds)],
                       index=rows.index, dtype=bool)
    live = rows[(rows["mode"] == "live") & (rows["temperature"] == 0) & (rows["methods"] != "AR")
                & rows["error"].isna() & ~heads]
    checked, identical, dtau = [], [], []
    for accepted, replayed in zip(live["accepted_per_block"], live["replay_accepted_per_block"]):
        has_replay = hasattr(replayed, "__len__")  # not None, NaN or pd.NA (a null Arrow list)
        checked.append(has_replay)
        identical.append(has_replay and list(accepted) == list(replayed))
        dtau.append(abs(_tau(list(accepted)) - _tau(list(replayed))) if has_replay else float("nan"))
    return live.assign(checked=checked, identical=identical, dtau=dtau)


def fidelity_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per pair, dtype and engine: live rows, rows checked against replay, rows identical,
    the rate in percent and the mean and largest |delta tau|."""
    live = fidelity_rows(rows)
    if live.empty:
        return pd.DataFrame(columns=COLUMNS)
    live = live.assign(engine=live["engine"].astype("str").fillna("-"))
    table = live.groupby(GROUP_KEYS).agg(
        **{"live rows": ("checked", "size"), "checked": ("checked", "sum"), "identical": ("identical", "sum"),
           "mean abs dtau": ("dtau", "mean"), "max abs dtau": ("dtau", "max")}
    ).reset_index()
    table["rate %"] = (100.0 * table["identical"] / table["checked"].where(table["checked"] > 0)).round(1)
    return table[COLUMNS].astype({"checked": int, "identical": int})


def fidelity_text(table: pd.DataFrame) -> str:
    """The sentence under the fidelity table; a warning wherever replay and live disagree."""
    if table.empty or table["checked"].sum() == 0:
        return "No live greedy speculative row was checked against replay (the run decoded none live)."
    disagree = table[table["identical"] < table["checked"]]
    if disagree.empty:
        return ("Replay gives live decoding's accepted counts in every checked row "
                f"({int(table['checked'].sum())}).")
    groups = "; ".join(
        f"{r['target']} <- {r['draft']} ({r['dtype']}, {r['engine']}): {r['checked'] - r['identical']} of "
        f"{r['checked']} rows differ, mean abs dtau {r['mean abs dtau']:.3f}"
        for r in disagree.to_dict("records")
    )
    return f"WARNING: replay and live disagree in {groups}. {NEAR_TIE_NOTE}"
