"""A run's rows in other tools' formats, so their own scripts read our runs.

`spec-bench`: Spec-Bench's `model_answer` JSONL. Per pair (target, draft, dtype) and
temperature, one file per drafting configuration, `<target>__<draft>__<dtype>__<label>-temp-<t>.jsonl`,
and one baseline of the target alone, `...__AR-temp-<t>.jsonl`, holding the AR rows of the
same questions, the timed one where a sample has several: Spec-Bench's `equal.py` compares two
files line by line, so every file is sorted by question id, and its `speed.py` averages
per-question tokens per second, so a baseline holding other questions (or untimed decodes)
would skew it. A line is one question: `question_id` (our sample id, which names the turn),
`category` (the dataset), `model_id`, and `choices[0]` with `turns` (the answer text),
`new_tokens`, `wall_time` (the decode's wall clock), `decoding_steps` (blocks) and
`accept_lengths`: tokens produced per block, i.e. accepted drafts + 1, our tau convention
(Spec-Bench's "mean accepted tokens"; subtract 1 for EAGLE's tau0). Only rows decoded live
carry a walltime of their own, so only they are exported; replayed rows have accepted counts
but no time of their own. Spec-Bench times one request at a time, so rows decoded in batches
over 1 are left out (their walltime is their batch's).
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from pipeline.reports.report import decoded_alone, with_tree_labels

FORMATS = ("spec-bench",)
PAIR = ["target", "draft", "dtype"]


def spec_bench_lines(rows: pd.DataFrame) -> dict[str, list[dict]]:
    """File name -> answer lines: every pair's live configurations and its baseline."""
    rows = decoded_alone(rows)
    rows = rows.assign(timed=rows["timed"].fillna(False) if "timed" in rows else False,
                       temperature=rows["temperature"].fillna(0.0) if "temperature" in rows else 0.0)
    done = with_tree_labels(rows[rows["error"].isna()])
    live, ar = done[done["mode"] == "live"], done[done["mode"] == "ar"]
    files: dict[str, list[dict]] = {}
    for (*pair, temperature), mine in live.groupby(PAIR + ["temperature"], observed=True, sort=True):
        for label, config in mine.groupby("method_label", observed=True, sort=True):
            files[file_name(pair, label, temperature)] = answer_lines(config, model_id(pair, label))
        asked = set(mine["sample_id"])
        baseline = ar[(ar[PAIR] == pair).all(axis=1) & (ar["temperature"] == temperature)
                      & ar["sample_id"].isin(asked)]
        # the timed decode of a question first: an untimed one shares the machine with other work
        baseline = baseline.sort_values("timed", ascending=False, kind="stable").drop_duplicates("sample_id")
        if len(baseline):
            files[file_name(pair, "AR", temperature)] = answer_lines(baseline, model_id(pair, "AR"))
    return files


def model_id(pair: list[str], label: str) -> str:
    return "__".join(quote(str(part), safe="") for part in [*pair, label])


def file_name(pair: list[str], label: str, temperature: float) -> str:
    return f"{model_id(pair, label)}-temp-{float(temperature)}.jsonl"


def answer_lines(rows: pd.DataFrame, model: str) -> list[dict]:
    """One line per question, sorted by question id."""
    lines = []
    for row in rows.sort_values("sample_id").to_dict("records"):
        wall = row.get("time_wall_s")
        # rows from before the wall clock
        wall = row["time_total_s"] if wall is None or pd.isna(wall) else wall
        accepted = [int(a) for a in row["accepted_per_block"]]
        lines.append({
            "question_id": f"{row['sample_id']}", "category": row["dataset"], "model_id": model,
            "choices": [{"index": 0, "turns": [row["output_text"]], "new_tokens": [int(row["new_tokens"])],
                         "wall_time": [float(wall)], "decoding_steps": [len(accepted)],
                         "accept_lengths": [a + 1 for a in accepted]}],
        })
    return lines


def export(rows: pd.DataFrame, folder: str | Path, fmt: str = "spec-bench") -> list[Path]:
    """Write `rows` in `fmt` under `folder`; the paths written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, lines in sorted(spec_bench_lines(rows).items()):
        path = folder / name
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        written.append(path)
    return written
