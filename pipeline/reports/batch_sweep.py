"""Where speculative decoding stops paying as the batch grows: per configuration and batch size
(requests decoded together, `pipeline.decoding.loop`), the batch's tokens/s, each
request's latency, the speedup over AR at the same batch, the batch size at which it first
falls below 1, and the speedup the calibration expects there.

Every row of a batch carries the batch's walltime: a configuration's time at one batch size
sums each row's `time_total_s / batch_requests`, i.e. every batch's time once. AR and SD at a
batch size decode the same samples in the same batches, so the speedup divides like by like.
The expected speedup is Eq. 1's corrected form with both ratios measured at that batch size:
tau / (gamma x Tq(B x draft rows) / Tp(B) + Tp(B, nodes + 1) / Tp(B)), tau each request's. It
leaves out what raggedness costs (a batch runs until its longest request stops; rows of
requests that stopped still ride along), which the measured figure includes.
"""
from __future__ import annotations

import pandas as pd

from pipeline.reports.audit import with_lossless_column
from pipeline.reports.pooling import pooled_tau
from pipeline.reports.report import batch_of, gamma_shown, method_order, with_tree_labels
from pipeline.reports.speedup import block_shapes, shapes_used
from pipeline.storage.calibration_store import Calibrations

CONFIG = ["target", "draft", "dtype", "engine", "temperature", "gamma", "method_label", "policy"]
# its AR baseline: the same pair and temperature
PAIR = ["target", "draft", "dtype", "engine", "temperature"]
COLUMNS = ["requests", "tau", "tokens/s", "AR tokens/s", "latency s", "AR latency s", "speedup", "expected",
           "= AR here", "= batch 1", "stops paying at batch"]


def output_lengths(rows: pd.DataFrame) -> pd.Series:
    """Each row's new tokens as output (its ids' length, or `output_length` where the rows were
    read with the ids reduced)."""
    return rows["output_length"] if "output_ids" not in rows else rows["output_ids"].map(len)


def batched_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """First-turn live and AR rows that decoded, with `batch` filled in, `seconds` (the row's
    share of its batch's time) and `tokens`; empty unless the run has a batch over 1."""
    if rows.empty or batch_of(rows).max() == 1:
        return rows[:0]
    ok = rows[rows["error"].isna() & (rows["turn"] == "first") & rows["mode"].isin(["live", "ar"])]
    ok = with_tree_labels(with_lossless_column(ok))
    requests = ok["batch_requests"].astype(object).where(ok["batch_requests"].notna(), 1).astype(float)
    return ok.assign(seconds=ok["time_total_s"] / requests, tokens=output_lengths(ok),
                     draft_steps=ok["gamma"], gamma=gamma_shown(ok))


def batch_table(rows: pd.DataFrame, calibrations: Calibrations) -> pd.DataFrame:
    """One line per SD configuration and batch size, AR first (`COLUMNS`); empty unless the run
    decoded batches over 1."""
    ok = batched_rows(rows)
    if ok.empty:
        return pd.DataFrame()
    ar = ok[ok["mode"] == "ar"]
    lines = []
    for key, sd in ok[ok["mode"] == "live"].groupby(CONFIG + ["batch"], sort=False):
        where = dict(zip(CONFIG + ["batch"], key))
        base = ar[(ar[PAIR + ["batch"]] == sd[PAIR + ["batch"]].iloc[0]).all(axis=1)]
        base = base[base["sample_id"].isin(sd["sample_id"])]
        mine = sd[sd["sample_id"].isin(base["sample_id"])]
        lines.append(where | {
            "requests": len(sd), "tau": pooled_tau(sd), "tokens/s": _rate(sd), "AR tokens/s": _rate(base),
            "latency s": sd["time_request_s"].median(), "AR latency s": base["time_request_s"].median(),
            "speedup": base["seconds"].sum() / mine["seconds"].sum() if len(base) else float("nan"),
            "expected": _expected(sd, where, calibrations),
            "= AR here": _share(sd["matches_ar"]),
            "= batch 1": _share(sd["matches_batch1"]) if key[-1] > 1 else "-",
        })
    table = pd.DataFrame(lines)
    first_loss = {key: _first_loss(group) for key, group in table.groupby(CONFIG, sort=False)}
    table["stops paying at batch"] = [first_loss[tuple(line[c] for c in CONFIG)]
                                      for _, line in table.iterrows()]
    order = sorted(range(len(table)), key=lambda i: (*(str(table[c].iloc[i]) for c in PAIR),
                                                     method_order(table["method_label"].iloc[i]),
                                                     str(table["policy"].iloc[i]), table["batch"].iloc[i]))
    return table.iloc[order].set_index(CONFIG + ["batch"])[COLUMNS]


def first_losses(table: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, the first batch size whose speedup is below 1 (`-`: it paid at every one)."""
    if table.empty:
        return table
    return table.reset_index().drop_duplicates(CONFIG).set_index(CONFIG)[["stops paying at batch"]]


def batch_text(table: pd.DataFrame) -> str:
    """A sentence on where SD stops paying, for the report."""
    losses = first_losses(table)["stops paying at batch"]
    paying = int((losses == "-").sum())
    sizes = ", ".join(str(b) for b in sorted(set(table.index.get_level_values("batch"))))
    text = (f"Batch sizes {sizes}: {len(losses) - paying} of {len(losses)} SD configurations stop paying "
            "(speedup over AR at the same batch below 1) at some batch size run")
    return text + (f"; {paying} pay at every one." if paying else ".")


def _rate(rows: pd.DataFrame) -> float:
    seconds = rows["seconds"].sum()
    return float(rows["tokens"].sum() / seconds) if seconds > 0 else float("nan")


def _share(matches: pd.Series) -> str:
    """`equal/compared`: rows whose output equals the reference's (None: no reference)."""
    known = matches.dropna()
    return f"{int(known.sum())}/{len(known)}"


def _expected(rows: pd.DataFrame, where: dict, calibrations: Calibrations) -> float:
    """The batch-aware Eq. 1 (corrected form) from the calibration's ratios at this batch size."""
    calib = calibrations.latest(where["target"], where["draft"], where["dtype"])
    steps = rows["draft_steps"].iloc[0]
    shapes = None if pd.isna(steps) else block_shapes(rows, int(steps))
    if calib is None or shapes is None:
        return float("nan")
    return pooled_tau(rows) / calib.block_cost(shapes_used(rows, shapes), int(where["batch"]))


def _first_loss(lines: pd.DataFrame) -> str:
    losing = lines[lines["speedup"] < 1]["batch"]
    return str(int(losing.min())) if len(losing) else "-"
