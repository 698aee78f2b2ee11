"""A live decode's walltime split into its parts (vision, each prefill, drafting, verifying,
TABED, the rest), as the speedup table's `time split %` shows it."""
from __future__ import annotations

import re

import pandas as pd

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.drafting.policies import GridSearchPolicy
from pipeline.reports.time_split import time_shares, time_split_text
from tests.conftest import solid


def test_a_live_decode_records_each_part_and_the_wall_clock(tiny_pair):
    target, draft = tiny_pair
    case = Sample("unit", "test", 0, "first", "USER: <image>\nDescribe it. ASSISTANT:", (solid((20, 90, 210)),))
    record = speculative_decode(target, draft, [case], DecodeConfig(methods="MT", policy=GridSearchPolicy(),
                                                                  max_new_tokens=12), None)[0]
    assert 0 < record.time_vision_s < record.time_target_prefill_s + record.time_draft_prefill_s <= record.time_prefill_s
    assert 0 < record.time_tabed_draft_s <= record.time_tabed_s and record.time_tabed_draft_s < record.time_draft_s
    assert record.time_total_s <= record.time_wall_s
    shares = time_shares(pd.DataFrame([vars(record)]))
    parts = ("time_target_prefill_s", "time_draft_prefill_s", "time_draft_s", "time_verify_s", "rest")
    assert abs(sum(shares[p] for p in parts) - 100) < 1e-6 and shares["rest"] >= 0
    text = time_split_text(pd.DataFrame([vars(record)]))
    assert re.fullmatch(r"prefill \d+\+\d+ \(vision \d+\) · draft \d+ · verify \d+ · TABED \d+ · rest \d+", text), text
    ar = autoregressive_decode(target, [case], max_new_tokens=12)[0]
    assert ar.time_draft_prefill_s == 0 and re.match(r"prefill \d+ \(vision", time_split_text(pd.DataFrame([vars(ar)])))
