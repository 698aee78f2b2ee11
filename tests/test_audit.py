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


def test_rows_read_with_output_digests_audit_as_rows_read_with_the_ids(tmp_path):
    """The report reads each output as a digest and its length; the audit it gives (which rows
    equal AR, and where each differing row first leaves it: those ids read on demand) is the
    audit of the rows read whole. The fixture's outputs differ from AR's in length."""
    import pytest

    from pipeline.reports.audit import audit
    from pipeline.reports.report_rows import read_report_rows, with_columns
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.storage.store import read_results, read_table, write_shards
    from tests.results_fixture import RUN, write_results

    table = read_table(write_results(tmp_path / "fixture"), RUN)
    changed = [None if ids is None or methods == "AR" or i % 3 else ids[:i % 7] + [ids[i % 7] + 1] + ids[i % 7 + 1:]
               for i, (ids, methods) in enumerate(zip(table["output_ids"].to_pylist(), table["methods"].to_pylist()))]
    ids = pa.array([new or old for new, old in zip(changed, table["output_ids"].to_pylist())], pa.list_(pa.int32()))
    out = tmp_path / "differing"
    table = table.set_column(table.schema.get_field_index("output_ids"), "output_ids", ids)
    for shard in set(table["shard"].to_pylist()):  # one shard per write, as a run writes them
        write_shards(out, table.filter(pc.equal(table["shard"], shard)))
    whole, reduced = read_results(out, RUN), read_report_rows(out, RUN)
    assert "output_ids" not in reduced and (reduced["output_length"] == whole["output_ids"].map(len)).all()
    asked = []

    def read_ids(chosen: pd.DataFrame) -> pd.DataFrame:
        asked.append(len(chosen))
        return with_columns(out, RUN, chosen, ["output_ids"])

    (table, differ), (reduced_table, reduced_differ) = audit(whole), audit(reduced, read_ids)
    assert len(differ) > 0 and 0 < table["equal to AR"].sum() < table["rows"].sum()
    as_text = lambda frame: frame.astype({c: "str" for c, t in frame.dtypes.items() if t == "category"})
    pd.testing.assert_frame_equal(as_text(reduced_table), table)  # the reduced rows' strings are codes
    pd.testing.assert_frame_equal(as_text(reduced_differ).reset_index(drop=True), differ.reset_index(drop=True))
    assert asked and asked[0] < len(reduced)  # only the differing rows and their AR rows were read
    with pytest.raises(ValueError, match="read_ids"):
        audit(reduced)

