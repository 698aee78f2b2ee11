"""Acceptance where it changes: rows record the target's prompt tokens (live, AR and replayed
rows alike) and the prompt's images; the report pools blocks per configuration and prompt-length
bucket (edges as parameters) or image count, and draws both."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.decoding.replay import replay
from pipeline.decoding.traces import collect_traces
from pipeline.reports.acceptance_where import (
    acceptance_by_context, acceptance_by_images, acceptance_where_section, context_buckets,
)
from tests.test_run_safety import sample


def test_buckets_follow_the_edges_given():
    tokens = pd.Series([10, 128, 300, 5000, None], dtype=float)
    assert list(context_buckets(tokens)) == ["<128", "128-255", "256-511", ">=2048", None]
    assert list(context_buckets(tokens, edges=(200,))) == ["<200", "<200", ">=200", ">=200", None]


def row(method: str, accepted: list[int], tokens: int, images: int, turn: str = "first") -> dict:
    return {"target": "t", "draft": "d", "dtype": "fp32", "turn": turn, "method_label": method, "error": None,
            "gamma": 3, "verify": "chain", "accepted_per_block": accepted, "prompt_tokens": tokens, "images": images}


def test_tau_and_the_acceptance_rate_pool_blocks_per_bucket_and_image_count(tmp_path):
    rows = pd.DataFrame([row("M", [3, 1], 100, 1), row("M", [0, 2], 120, 2, turn="qaorg"),
                         row("M", [0, 0], 300, 1), row("MT", [3, 3], 3000, 2)])
    context = acceptance_by_context(rows)
    m = context[context["method_label"] == "M"].set_index("prompt_tokens_bucket")
    assert list(m.index) == ["<128", "256-511"]  # turns pooled, buckets in length order
    assert m.loc["<128", "requests"] == 2 and m.loc["<128", "tau"] == pytest.approx(1 + 6 / 4)
    assert m.loc["<128", "acceptance_rate"] == pytest.approx(6 / 12) and m.loc["256-511", "tau"] == 1.0
    images = acceptance_by_images(rows)
    assert images[images["method_label"] == "M"].set_index("images")["tau"].to_dict() == \
        pytest.approx({1: 1 + 4 / 4, 2: 1 + 2 / 2})
    text = acceptance_where_section(rows, tmp_path, edges=(200,))
    assert "### By prompt tokens" in text and "### By images in the prompt" in text
    for stem in ("acceptance_by_context", "acceptance_by_images"):
        assert (tmp_path / f"{stem}.csv").exists() and (tmp_path / f"{stem}.png").stat().st_size > 0
    assert set(pd.read_csv(tmp_path / "acceptance_by_context.csv")["prompt_tokens_bucket"]) == {"<200", ">=200"}
    assert acceptance_where_section(rows.drop(columns=["prompt_tokens", "images"]), tmp_path) == ""  # old rows
    assert acceptance_where_section(rows.assign(prompt_tokens=None, images=None), tmp_path) == ""  # read as nulls


def test_live_ar_and_replayed_records_carry_the_prompt_length(tiny_pair):
    target, draft = tiny_pair
    s = sample(0)
    ar = autoregressive_decode(target, [s], max_new_tokens=8)[0]
    config = DecodeConfig("M", gamma=3, max_new_tokens=8)
    live = speculative_decode(target, draft, [s], config)[0]
    traces = collect_traces(target, draft, s, "M", None, max_new_tokens=8, engine="eager")
    replayed = replay(traces, config)
    assert ar.prompt_tokens == live.prompt_tokens == replayed.prompt_tokens == len(target.tokenize_prompt(s.prompt))
