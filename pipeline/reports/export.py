"""A run's rows in other tools' formats, so their own scripts read our runs.

`spec-bench`: Spec-Bench's `model_answer` JSONL, one file per model pair and drafting
configuration (and one of the target alone, `AR`, for its baseline), one line per live row,
each a question: `question_id` (our sample id and turn), `category` (the dataset), `model_id`,
and `choices[0]` with `turns` (the answer text), `new_tokens`, `wall_time` (the decode's wall
clock), `decoding_steps` (blocks) and `accept_lengths`: tokens produced per block, i.e. accepted
drafts + 1, our tau convention (Spec-Bench's "mean accepted tokens"; subtract 1 for EAGLE's
tau0). Only rows decoded live carry a walltime, so only they are exported; replayed rows have
accepted counts but no time of their own. Spec-Bench times one request at a time, so rows
decoded in batches over 1 are left out (their walltime is their batch's).
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from pipeline.reports.report import decoded_alone, with_tree_labels

FORMATS = ("spec-bench",)


def spec_bench_lines(rows: pd.DataFrame) -> dict[str, list[dict]]:
    """File name -> answer lines, for the live rows (and AR rows) of `rows`."""
    rows = decoded_alone(rows)
    live = with_tree_labels(rows[rows["error"].isna() & rows["mode"].isin(["live", "ar"])])
    files: dict[str, list[dict]] = {}
    for row in live.to_dict("records"):
        label = "AR" if row["mode"] == "ar" else row["method_label"]
        parts = [row["target"]] + ([] if label == "AR" else [row["draft"]]) + [row["dtype"], label]
        model_id = "__".join(quote(str(part), safe="") for part in parts)
        wall = row.get("time_wall_s")
        # rows from before the wall clock
        wall = row["time_total_s"] if wall is None or pd.isna(wall) else wall
        accepted = [int(a) for a in row["accepted_per_block"]]
        files.setdefault(f"{model_id}.jsonl", []).append({
            "question_id": f"{row['sample_id']}", "category": row["dataset"], "model_id": model_id,
            "choices": [{"index": 0, "turns": [row["output_text"]], "new_tokens": [int(row["new_tokens"])],
                         "wall_time": [float(wall)], "decoding_steps": [len(accepted)],
                         "accept_lengths": [a + 1 for a in accepted]}],
        })
    # an AR row serves every draft of its target: one line per sample and turn
    return {name: list({line["question_id"]: line for line in lines}.values())
            for name, lines in files.items()}


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
