"""SD-valid latency: a live decode stamps each request's time to first token when the host reads
that token (AR: after the prefill; SD: after its first block), rows derive the time per output
token after it, and the report gives P50/P95/P99 of both and of the request's latency per
configuration, over the timed requests where a run timed some."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.planning.grid import Pair, RunConfig
from pipeline.reports.latency import latency_table
from pipeline.storage.schema import make_row
from tests.test_run_safety import sample

PAIR = Pair("tiny:target", "tiny:draft", "fp32")


def rows_of(target, draft, samples, *, timed: set[str]) -> pd.DataFrame:
    rows = []
    for s in samples:
        ar = autoregressive_decode(target, [s], max_new_tokens=12)[0]
        rows.append(make_row("r", "s", RunConfig(PAIR, DecodeConfig("AR", gamma=None)), s, ar,
                             s.sample_id in timed))
        config = DecodeConfig("M", gamma=3, max_new_tokens=12)
        sd = speculative_decode(target, draft, [s], config)[0]
        rows.append(make_row("r", "s", RunConfig(PAIR, config), s, sd, s.sample_id in timed))
    return pd.DataFrame(rows)


def test_live_rows_carry_ttft_and_tpot_and_the_report_gives_their_percentiles(tiny_pair):
    target, draft = tiny_pair
    samples = [sample(i, colour=(40 * i, 0, 0)) for i in range(3)]
    rows = rows_of(target, draft, samples, timed={samples[0].sample_id, samples[1].sample_id})
    for row in rows.to_dict("records"):
        assert 0 < row["ttft_s"] <= row["time_wall_s"]
        assert row["tpot_s"] == pytest.approx((row["time_wall_s"] - row["ttft_s"]) / (row["new_tokens"] - 1))
    sd = rows[rows["mode"] == "live"]
    first_block = sd["time_prefill_s"]  # SD's first token needs the prefills and then a block
    assert (sd["ttft_s"] > first_block).all()
    table = latency_table(rows)
    assert list(table.index.get_level_values("configuration")) == ["AR", "M"]
    assert (table["requests"] == 2).all()  # the timed requests only: the third was not timed
    timed = rows[rows["timed"]]
    for label, mode in (("AR", "ar"), ("M", "live")):
        mine = timed[timed["mode"] == mode]
        line = table.xs(label, level="configuration").iloc[0]
        assert line["ttft_p50_ms"] == pytest.approx(mine["ttft_s"].median() * 1e3)
        assert line["tpot_p99_ms"] == pytest.approx(mine["tpot_s"].quantile(0.99) * 1e3)
        assert line["ttft_p50_ms"] <= line["ttft_p95_ms"] <= line["ttft_p99_ms"]
    replayed = rows.assign(mode="replay", ttft_s=None)
    assert latency_table(replayed).empty  # replay scores tokens, not time
