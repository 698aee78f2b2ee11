"""The lossless audit on hand-made rows: equal and forced-divergent outputs, what is left
unaudited, and the sentence the summary prints."""
from __future__ import annotations

import pandas as pd

from pipeline.reports.audit import BF16_NOTE, lossless_table, lossless_text, with_lossless_column


def row(methods: str, ids: list[int], *, dtype: str = "fp32", sample: str = "s0", temperature: float = 0.0,
        error: str | None = None, engine: str = "static") -> dict:
    return {"target": "t", "draft": "d", "dtype": dtype, "engine": engine, "sample_id": sample, "turn": "first",
            "max_new_tokens": 8, "methods": methods, "temperature": temperature, "error": error, "output_ids": ids}


def test_each_greedy_sd_row_is_compared_with_its_ar_row():
    rows = pd.DataFrame([
        row("AR", [1, 2, 3]),
        row("M", [1, 2, 3]),
        row("MT", [1, 2, 4]),  # forced divergence
        row("M", [9], temperature=0.7),  # sampled: not audited
        row("T", [], error="boom"),  # failed: not audited
        row("M", [1, 2, 3], engine="eager"),  # no eager AR row: no reference
    ])
    audited = with_lossless_column(rows)
    assert audited["matches_ar"].tolist() == [None, True, False, None, None, None]
    table = lossless_table(rows)
    assert table[["rows", "equal to AR", "rate %"]].values.tolist() == [[2, 1, 50.0]]
    assert "WARNING" in lossless_text(table)


def test_bf16_divergence_is_explained_and_full_agreement_said_plainly():
    bf16 = pd.DataFrame([row("AR", [1, 2], dtype="bf16"), row("M", [1, 3], dtype="bf16")])
    assert BF16_NOTE in lossless_text(lossless_table(bf16))
    exact = pd.DataFrame([row("AR", [1, 2]), row("M", [1, 2]), row("MT", [1, 2])])
    assert lossless_text(lossless_table(exact)) == "Every audited row (2) equals the target's own greedy output."


def test_each_differing_row_says_where_it_first_left_the_targets_output():
    from pipeline.reports.audit import divergences

    rows = pd.DataFrame([
        {**row("AR", [1, 2, 3, 4], dtype="bf16"), "method_label": "AR", "verify": None},
        {**row("M", [1, 2, 9, 4], dtype="bf16"), "method_label": "M", "verify": "chain"},
        {**row("MT", [1, 2], dtype="bf16"), "method_label": "MT", "verify": "chain"},  # stopped early (EOS)
        {**row("T", [1, 2, 3, 4], dtype="bf16"), "method_label": "T", "verify": "chain"},
    ])
    audited = with_lossless_column(rows)
    assert audited["first_divergence"].tolist() == [None, 2, 2, None]
    assert audited["divergent_tokens"].tolist() == [None, "9 / 3", "end / 3", None]
    differ = divergences(rows)
    assert differ["method_label"].tolist() == ["M", "MT"]
    text = lossless_text(lossless_table(rows), differ)
    assert "first leave it at new token 2 (median; earliest 2, latest 2)" in text and BF16_NOTE in text


def test_a_batched_row_is_compared_with_ar_at_its_batch_and_with_the_request_decoded_alone():
    """Batching may round the last bits differently: SD at batch 2 must equal AR at batch 2, and
    the audit counts (never assumes) how many batched rows equal the request decoded alone."""
    batched = lambda methods, ids, sample="s0": {**row(methods, ids, sample=sample), "batch": 2}
    rows = pd.DataFrame([
        {**row("AR", [1, 2, 3]), "batch": 1}, {**row("AR", [5, 6]), "batch": None, "sample_id": "s1"},
        batched("AR", [1, 2, 4]), batched("M", [1, 2, 4]),  # batching changed the AR output: SD follows it
        batched("AR", [5, 6], "s1"), batched("M", [5, 6], "s1"),
        {**row("M", [1, 2, 3]), "batch": 1},
    ])
    audited = with_lossless_column(rows)
    assert audited["matches_ar"].tolist() == [None, None, None, True, None, True, True]
    assert audited["matches_batch1"].tolist() == [None, None, False, False, True, True, None]
    table = lossless_table(rows)
    assert table[["rows", "equal to AR", "batched rows", "equal to batch 1"]].values.tolist() == [[3, 3, 2, 1]]
    assert "Of the 2 greedy speculative rows decoded in batches over 1, 1 give" in lossless_text(table)
    assert "batched rows" not in lossless_table(rows[rows["batch"] != 2])  # no batches: the table as before
