"""Replay fidelity on hand-made rows: agreement, a forced disagreement, rows without a
replay, and the sentence the summary prints."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.reports.fidelity import NEAR_TIE_NOTE, fidelity_table, fidelity_text


def row(accepted, replayed, *, mode="live", methods="M", dtype="fp32", temperature=0.0, error=None) -> dict:
    return {"target": "t", "draft": "d", "dtype": dtype, "engine": "eager", "mode": mode, "methods": methods,
            "temperature": temperature, "error": error, "accepted_per_block": accepted,
            "replay_accepted_per_block": replayed}


def test_live_rows_are_compared_with_their_replay():
    rows = pd.DataFrame([
        row([2, 1], [2, 1]),
        row([3, 0, 1], [3, 1, 0]),  # same tau, other blocks: not identical
        row([4, 4], [4, 3]),  # forced divergence: |dtau| = 0.5
        row([1], None),  # its replay failed: live, not checked
        row([1], None, mode="replay"),  # replayed rows are what is being checked, not checks
        row([0], None, methods="AR", mode="ar"),
        row([2], None, temperature=0.7),  # sampling: no replay exists
        row([], None, error="boom"),
    ])
    table = fidelity_table(rows)
    assert table[["live rows", "checked", "identical"]].values.tolist() == [[4, 3, 1]]
    assert table.loc[0, "rate %"] == pytest.approx(33.3)
    assert table.loc[0, "mean abs dtau"] == pytest.approx(0.5 / 3) and table.loc[0, "max abs dtau"] == pytest.approx(0.5)
    text = fidelity_text(table)
    assert text.startswith("WARNING") and "2 of 3 rows differ" in text and NEAR_TIE_NOTE in text


def test_agreement_and_runs_without_live_rows_said_plainly():
    agree = pd.DataFrame([row([2, 1], [2, 1]), row([0], [0], methods="MT")])
    assert fidelity_text(fidelity_table(agree)) == "Replay gives live decoding's accepted counts in every checked row (2)."
    old = pd.DataFrame([row([1], None, mode="replay")]).drop(columns="replay_accepted_per_block")  # results from before the column
    assert fidelity_table(old).empty and fidelity_text(fidelity_table(old)).startswith("No live greedy")
