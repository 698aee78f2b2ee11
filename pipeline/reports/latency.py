"""Per-request latency as serving benchmarks report it, valid for speculative decoding: time to
first token (TTFT: the prefill and, for SD, its first block), time per output token after it
(TPOT: the request's latency less its TTFT, over its tokens after the first, so SD's bursts of
accepted tokens are spread over the tokens they deliver rather than counted as one gap), and
the request's whole latency, each as P50/P95/P99 over the requests of a configuration, AR's
beside SD's. Only rows decoded live carry times; where a run timed some samples (a grid in
`auto` mode), only those count, since its other AR rows shared the machine with other work.
"""
from __future__ import annotations

import pandas as pd

from pipeline.reports.report import configuration_labels, method_order

INDEX = ["target", "draft", "dtype", "engine", "configuration"]
PERCENTILES = (50, 95, 99)


def latency_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows whose times are a request's own: decoded live (SD or AR), no error, timed
    where the run timed some."""
    if "ttft_s" not in rows:
        return rows.iloc[0:0]
    live = rows[rows["mode"].isin(["live", "ar"]) & rows["error"].isna() & rows["ttft_s"].notna()]
    if "timed" not in live:
        return live
    timed = live["timed"].fillna(False).astype(bool)
    return live[timed] if timed.any() else live


def latency_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: requests, then P50/P95/P99 of TTFT and TPOT in milliseconds and of
    the request's latency in seconds."""
    live = latency_rows(rows)
    if live.empty:
        return pd.DataFrame()
    request = live["time_request_s"].fillna(live["time_wall_s"])
    live = live.assign(configuration=configuration_labels(live, ["target", "draft", "dtype"]),
                       ttft_ms=live["ttft_s"] * 1e3, tpot_ms=live["tpot_s"] * 1e3, latency_s=request)
    grouped = live.groupby(INDEX, observed=True, sort=False)
    columns = {"requests": grouped.size()}
    for name in ("ttft_ms", "tpot_ms", "latency_s"):
        measure, unit = name.rsplit("_", 1)
        for p in PERCENTILES:
            columns[f"{measure}_p{p}_{unit}"] = grouped[name].quantile(p / 100)
    table = pd.DataFrame(columns)
    order = sorted(table.index, key=lambda key: (*map(str, key[:-1]), method_order(key[-1])))
    return table.loc[order]
