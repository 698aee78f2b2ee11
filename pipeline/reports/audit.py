"""Lossless audit: does each greedy speculative row give the target's own greedy output?

Greedy SD is lossless in exact arithmetic, and fp32/fp16 runs measure it exact. In bf16 a
`gamma + 1`-token verify forward rounds differently from one-token steps, so a run can drift
from the target's own greedy output after a near-tie; the audit measures how often instead of
assuming it never happens, and names where each differing row first left the target's output
(`first_divergence`, the two tokens there). The reference for a row is the AR row of the same
pair, dtype, engine, batch size, sample, turn and token budget. A batched row (batch > 1) is
also compared with the AR row of its sample decoded alone (`matches_batch1`): batched matrix
products may round the last bits differently, so the audit counts how often batching changed
an output rather than assuming it never does.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from pipeline.reports.pooling import present
from pipeline.reports.report import batch_of

REFERENCE_KEYS = ["target", "draft", "dtype", "engine", "batch", "sample_id", "turn", "max_new_tokens"]
GROUP_KEYS = ["target", "draft", "dtype", "engine"]
# what else makes two rows one configuration (besides batch): a sampled row's batch-1 reference
CONFIG_KEYS = ["methods", "policy", "verify", "gamma", "temperature", "seed"]
SHOWN = REFERENCE_KEYS + ["method_label", "verify", "first_divergence", "divergent_tokens"]  # a differing row
# what the audit reads of a row: its keys, its output, and where `read_ids` finds its ids (key, partition)
READ = [*REFERENCE_KEYS, *CONFIG_KEYS, "error", "method_label", "key", "dataset", "output_ids",
        "output_digest"]
BF16_NOTE = (
    "Rows below 100% in bf16 are expected: the target scores gamma + 1 proposed tokens in one "
    "forward, which rounds differently from the one-token steps of its own greedy decoding, so "
    "at a near-tie the two can pick different tokens (transformers' assisted generation "
    "diverges the same way). fp32 and fp16 should be 100%; anything less there is a bug."
)


IdsReader = Callable[[pd.DataFrame], pd.DataFrame]  # rows -> the same rows with `output_ids` (report_rows)


def outputs_of(rows: pd.DataFrame) -> list:
    """Each row's output as a value that two rows share only when their outputs are the same:
    the token ids as a tuple, or their digest where the rows were read reduced (`report_rows`)."""
    if "output_ids" in rows:
        return [None if ids is None else tuple(ids) for ids in rows["output_ids"]]
    return rows["output_digest"].tolist()


def with_lossless_column(rows: pd.DataFrame, read_ids: IdsReader | None = None) -> pd.DataFrame:
    """`rows` plus `matches_ar`: True/False for greedy SD and replay rows that have an AR
    reference at their batch size, None for AR rows, sampled rows, error rows and rows without a
    reference; and `matches_batch1`: for batched greedy rows (AR rows too), whether the output
    is the AR output of the same sample decoded alone, and for batched sampled SD rows, whether
    it is the same configuration's output for the sample decoded alone (each request draws from
    its own generator, so it should be wherever the arithmetic allows); None elsewhere. Rows
    that differ from AR get `first_divergence` and `divergent_tokens`; where the rows hold no
    `output_ids`, only when `read_ids` is given, which reads them for those rows alone. Rows are
    matched by group numbers over their keys, not a Python tuple per row (millions of rows)."""
    rows = rows.assign(batch=batch_of(rows))
    outputs = pd.Series(outputs_of(rows), dtype=object).to_numpy()
    batch = rows["batch"].to_numpy()
    greedy = ((rows["temperature"] == 0) & rows["error"].isna()).to_numpy()
    is_ar = (rows["methods"] == "AR").to_numpy()
    own, alone = _key_groups(rows, REFERENCE_KEYS)
    reference = _holder_of(own, greedy & is_ar)
    references = np.where(greedy & ~is_ar, reference[own], -1)
    matches = _compared(outputs, references)
    batch1 = _compared(outputs, np.where(greedy & (batch > 1), reference[alone], -1))
    sampled = ((rows["temperature"] > 0) & rows["error"].isna() & (rows["methods"] != "AR")).to_numpy()
    if sampled.any():  # a batched sampled row against its configuration's batch-1 row
        own, alone = _key_groups(rows, REFERENCE_KEYS + [c for c in CONFIG_KEYS if c in rows])
        alone_rows = np.where(sampled & (batch > 1), _holder_of(own, sampled & (batch == 1))[alone], -1)
        batch1 = np.where(alone_rows >= 0, _compared(outputs, alone_rows), batch1)
    positions, tokens = _divergences(rows, matches, references, read_ids)
    return rows.assign(matches_ar=pd.Series(matches, index=rows.index, dtype="object"),
                       first_divergence=pd.Series(positions, index=rows.index, dtype="object"),
                       divergent_tokens=pd.Series(tokens, index=rows.index, dtype="object"),
                       matches_batch1=pd.Series(batch1, index=rows.index, dtype="object"))


def _key_groups(rows: pd.DataFrame, columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's group number over `columns`, and the number of its key at batch 1, counted
    together so the two compare."""
    keys = rows[columns]
    both = pd.concat([keys, keys.assign(batch=1)], ignore_index=True)
    groups = both.groupby(columns, sort=False, dropna=False).ngroup().to_numpy()
    return groups[:len(rows)], groups[len(rows):]


def _holder_of(groups: np.ndarray, holds: np.ndarray) -> np.ndarray:
    """Per group number, the position of its last row where `holds`; -1 where none."""
    holder = np.full(int(groups.max()) + 1 if len(groups) else 0, -1)
    holder[groups[holds]] = np.flatnonzero(holds)
    return holder


def _compared(outputs: np.ndarray, references: np.ndarray) -> np.ndarray:
    """Per row, whether its output is its reference row's (None where `references` is -1)."""
    compared = np.full(len(outputs), None, dtype=object)
    has = references >= 0
    compared[has] = (outputs[has] == outputs[references[has]]).tolist()
    return compared


def _divergences(rows: pd.DataFrame, matches: np.ndarray, references: np.ndarray, read_ids: IdsReader | None
                 ) -> tuple[list, list]:
    """`first_divergence` and `divergent_tokens` per row (None where the row equals AR or has no
    AR row), from the ids of the differing rows and their AR rows only."""
    positions, tokens = [None] * len(rows), [None] * len(rows)
    differ = [i for i, match in enumerate(matches) if match is False]
    if not differ or ("output_ids" not in rows and read_ids is None):
        return positions, tokens
    needed = sorted(set(differ) | {int(references[i]) for i in differ})
    chosen = rows.iloc[needed]
    ids = dict(zip(needed, (chosen if "output_ids" in rows else read_ids(chosen))["output_ids"]))
    for i in differ:
        positions[i], tokens[i] = first_divergence(list(ids[i]), list(ids[int(references[i])]))
    return positions, tokens


def first_divergence(ids: list[int], expected: list[int]) -> tuple[int, str]:
    """Where a speculative output first leaves the target's own (0-based new-token position)
    and the two tokens there, `SD token / AR token` (`end` where one output stopped)."""
    position = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b),
                    min(len(ids), len(expected)))
    ours, theirs = (str(seq[position]) if position < len(seq) else "end" for seq in (ids, expected))
    return position, f"{ours} / {theirs}"


def divergences(rows: pd.DataFrame, read_ids: IdsReader | None = None) -> pd.DataFrame:
    """The greedy speculative rows that differ from the target's own greedy output, with where."""
    return audit(rows, read_ids)[1]


def lossless_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per pair, dtype and engine: audited rows, rows equal to AR, and the rate in percent."""
    return audit(rows)[0]


def audit(rows: pd.DataFrame, read_ids: IdsReader | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(`lossless_table`, `divergences`) from one comparison of every row with its AR row;
    `read_ids` reads the ids of the rows that differ where `rows` hold digests alone."""
    return audit_table(*audit_counts(rows, read_ids))


def audit_counts(rows: pd.DataFrame, read_ids: IdsReader | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(audited rows counted per `GROUP_KEYS` and outcome, `matches_ar` and `matches_batch1`; the
    rows that differ, with where): what `audit_table` reads. A row's AR reference lies in its own
    partition folder (same target, draft and sample), so a run's folders may be audited one at a
    time and their counts and rows put one after another."""
    if "output_ids" not in rows and read_ids is None:
        raise ValueError("rows read with output digests need read_ids to say where outputs differ")
    audited = with_lossless_column(rows[present(rows, READ)], read_ids)  # a lean copy: millions of rows
    differ = audited[audited["matches_ar"] == False]  # noqa: E712  (object column: True, False or None)
    differ = differ[[column for column in SHOWN if column in differ]]  # hand-made rows may lack the labels
    audited = audited[audited["matches_ar"].notna()]
    outcomes = GROUP_KEYS + ["matches_ar", "matches_batch1"]
    counts = audited.groupby(outcomes, sort=False, dropna=False, observed=True).size()
    return counts.rename("rows").reset_index(), differ


def audit_table(counts: pd.DataFrame, differ: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(`lossless_table`, `divergences`) from `audit_counts` (of one frame, or of several one
    after another)."""
    counts = counts[counts[GROUP_KEYS].notna().all(axis=1)]  # what a group-by over the rows keeps
    if counts.empty:
        return pd.DataFrame(columns=GROUP_KEYS + ["rows", "equal to AR", "rate %"]), differ
    def summed(frame: pd.DataFrame, column: str) -> pd.DataFrame:  # rows, and those whose `column` is True
        equal = frame["rows"].where(frame[column] == True, 0)  # noqa: E712  (True, False or None)
        return frame.assign(equal=equal).groupby(GROUP_KEYS, observed=True)[["rows", "equal"]].sum()

    table = summed(counts, "matches_ar").reset_index().rename(columns={"equal": "equal to AR"})
    table["rate %"] = (100.0 * table["equal to AR"] / table["rows"]).round(1)
    batched = counts[counts["matches_batch1"].notna()]
    if len(batched):  # a run with batches over 1: how many of their rows batching changed
        same = summed(batched, "matches_batch1").rename(columns={"rows": "batched", "equal": "same"})
        table = table.merge(same.reset_index(), on=GROUP_KEYS, how="left").fillna({"batched": 0, "same": 0})
        table = table.rename(columns={"batched": "batched rows", "same": "equal to batch 1"})
    return table, differ


def lossless_text(table: pd.DataFrame, differ: pd.DataFrame | None = None) -> str:
    """One or two sentences under the audit table; `differ`: the rows that differ (`divergences`)."""
    if table.empty:
        return "No greedy speculative row had an AR row to compare with."
    return _lossless_sentence(table, differ) + _batch1_sentence(table)


def _batch1_sentence(table: pd.DataFrame) -> str:
    if "batched rows" not in table:
        return ""
    batched, same = int(table["batched rows"].sum()), int(table["equal to batch 1"].sum())
    text = (f" Of the {batched} greedy speculative rows decoded in batches over 1, {same} give the target's "
            f"output decoded alone (batch 1)")
    if same == batched:
        return text + ": batching changed no output here."
    return (text + f"; {batched - int(same)} differ, where batched matrix products rounded differently from "
            "one request's (each still compared with AR at its own batch above).")


def _lossless_sentence(table: pd.DataFrame, differ: pd.DataFrame | None) -> str:
    below = table[table["equal to AR"] < table["rows"]]
    if below.empty:
        return f"Every audited row ({int(table['rows'].sum())}) equals the target's own greedy output."
    text = (f"{len(below)} of {len(table)} pair/dtype/engine groups have rows that differ from "
            "the target's greedy output.")
    if differ is not None and len(differ):
        where = differ["first_divergence"].astype(int)
        text += (f" The {len(differ)} differing rows first leave it at new token {int(where.median())} "
                 f"(median; earliest {where.min()}, latest {where.max()}); each row, position and token "
                 "pair: `divergences.csv`.")
    if set(below["dtype"]) <= {"bf16"}:
        return f"{text} {BF16_NOTE}"
    return f"{text} WARNING: differences outside bf16 mean speculative decoding was not lossless here."
