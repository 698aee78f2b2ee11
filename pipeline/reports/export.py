"""A run's rows in other tools' formats, so their own scripts read our runs.

`spec-bench`: Spec-Bench's `model_answer` JSONL. Per pair (target, draft, dtype) and
temperature, one file per drafting configuration,
`<target>__<draft>__<dtype>__<label>-temperature-<t>.jsonl` (its inference scripts'
`<model id>-temperature-<t>`, the temperature as Python prints a float: `0.0`), and one
baseline of the target alone, `...__AR-temperature-<t>.jsonl`, holding the AR rows of the
same questions, the timed one where a sample has several: Spec-Bench's `equal.py` compares two
files line by line, so every file is sorted by question id, and its `speed.py` averages
per-question tokens per second, so a baseline holding other questions (or untimed decodes)
would skew it. A line is one question: `question_id` (our sample id, which names the turn),
`category` (the dataset), `model_id` (the file's name without `.jsonl`, as Spec-Bench's
scripts write it), and `choices[0]` with `turns` (the answer text),
`new_tokens`, `wall_time` (the decode's wall clock), `decoding_steps` (blocks) and
`accept_lengths`: tokens produced per block, i.e. accepted drafts + 1, our tau convention
(Spec-Bench's "mean accepted tokens"; subtract 1 for EAGLE's tau0). Only rows decoded live
carry a walltime of their own, so only they are exported; replayed rows have accepted counts
but no time of their own. Spec-Bench times one request at a time, so rows decoded in batches
over 1 are left out (their walltime is their batch's).

`mmspec`: MMSpec's result JSONL, per pair a folder with `<label>-temperature-<t>.jsonl` per
drafting configuration and `baseline-temperature-<t>.jsonl` (AR), the names its
`evaluation/summarize_metrics.py` discovers, the temperature as its scripts write it (`0` for
greedy, `0.7`, `1`), which its summarizer's default (`--temperature 0`) reads. A record is
one conversation: `question_id` (the sample, and for a second turn its task), `category` (the
dataset), `topic` (the sample's category) and `choices[0]` with per-turn lists `turns`,
`new_tokens`, `wall_time`,
`acceptance_length` (accepted drafts per block, no bonus token; none for the baseline), `idxs`
(blocks), `draft_time` and `target_time` (our draft and verify phases). A second turn follows
its first in one record when both were decoded live; its summarizer's MAT (new tokens over
blocks) is our tau less what the token budget cut from a last block. The same rows as
Spec-Bench's: live, decoded alone, the timed AR decode of each question for the baseline.

`speculation-profile`: one `speculation_profile.json` per configuration, from every row with
accepted counts, replayed ones too (`pipeline.reports.speculation_profile`).
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pandas as pd

from pipeline.reports.report import decoded_alone, wall_times, with_tree_labels
from pipeline.reports.speculation_profile import speculation_profiles

PAIR = ["target", "draft", "dtype"]


def exported_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(SD rows, AR rows) with a walltime of their own: decoded live and alone, no error; the AR
    rows are each question's timed decode (one per pair, temperature and sample) of the
    questions the pair's SD rows hold, since an untimed one shared the machine with other work."""
    rows = decoded_alone(rows)
    rows = rows.assign(timed=rows["timed"].fillna(False) if "timed" in rows else False,
                       wall_s=wall_times(rows),
                       temperature=rows["temperature"].fillna(0.0) if "temperature" in rows else 0.0)
    done = with_tree_labels(rows[rows["error"].isna()])
    live, ar = done[done["mode"] == "live"], done[done["mode"] == "ar"]
    asked = live[PAIR + ["temperature", "sample_id"]].drop_duplicates()
    baseline = ar.merge(asked, on=asked.columns.tolist())
    baseline = baseline.sort_values("timed", ascending=False, kind="stable")
    return live, baseline.drop_duplicates(PAIR + ["temperature", "sample_id"])


def spec_bench_lines(rows: pd.DataFrame) -> dict[str, list[dict]]:
    """File name -> answer lines: every pair's live configurations and its baseline."""
    live, baseline = exported_rows(rows)
    files: dict[str, list[dict]] = {}
    for (*pair, temperature), mine in live.groupby(PAIR + ["temperature"], observed=True, sort=True):
        for label, config in mine.groupby("method_label", observed=True, sort=True):
            name = spec_bench_id(pair, label, temperature)
            files[f"{name}.jsonl"] = answer_lines(config, name)
        base = baseline[(baseline[PAIR] == pair).all(axis=1) & (baseline["temperature"] == temperature)]
        if len(base):
            name = spec_bench_id(pair, "AR", temperature)
            files[f"{name}.jsonl"] = answer_lines(base, name)
    return files


def mmspec_records(rows: pd.DataFrame) -> dict[str, list[dict]]:
    """`<pair folder>/<label>-temperature-<t>.jsonl` -> conversation records."""
    live, baseline = exported_rows(rows)
    files: dict[str, list[dict]] = {}
    for (*pair, temperature), mine in pd.concat([live, baseline]).groupby(PAIR + ["temperature"],
                                                                          observed=True, sort=True):
        for label, config in mine.groupby("method_label", observed=True, sort=True):
            name = "baseline" if label == "AR" else quote(str(label), safe="")
            files[f"{pair_id(pair)}/{name}-temperature-{float(temperature):g}.jsonl"] = conversations(
                config, model_id(pair, label))
    return files


def conversations(rows: pd.DataFrame, model: str) -> list[dict]:
    """One record per conversation, sorted by question id: a second turn with the first turn
    of its sample before it where that was decoded too, else a turn alone."""
    turns = {row["sample_id"]: row for row in rows.to_dict("records")}
    first_of = lambda row: turns.get(row["sample_id"].rsplit("/", 1)[0] + "/first")
    opening = {id(first_of(r)) for r in turns.values() if r["turn"] != "first"}  # first turns continued
    records = []
    for sample_id, row in sorted(turns.items()):
        if id(row) in opening:
            continue  # recorded with its second turn
        chain = [first_of(row), row] if row["turn"] != "first" and first_of(row) is not None else [row]
        records.append({"question_id": sample_id, "category": row["dataset"],
                        "topic": row.get("category") or "unknown", "model_id": model,
                        "choices": [choice(chain, with_acceptance=row["mode"] != "ar")]})
    return records


def choice(turns: list[dict], *, with_acceptance: bool) -> dict:
    """MMSpec's `choices[0]`: per-turn lists."""
    made = {"index": 0, "turns": [t["output_text"] for t in turns],
            "new_tokens": [int(t["new_tokens"]) for t in turns],
            "wall_time": [float(t["wall_s"]) for t in turns],
            "idxs": [len(t["accepted_per_block"]) for t in turns],
            "draft_time": [float(t.get("time_draft_s") or 0.0) for t in turns],
            "target_time": [float(t.get("time_verify_s") or 0.0) for t in turns]}
    if with_acceptance:
        made["acceptance_length"] = [[int(a) for a in t["accepted_per_block"]] for t in turns]
    return made


def pair_id(pair: list[str]) -> str:
    return "__".join(quote(str(part), safe="") for part in pair)


def model_id(pair: list[str], label: str) -> str:
    return f"{pair_id(pair)}__{quote(str(label), safe='')}"


def spec_bench_id(pair: list[str], label: str, temperature: float) -> str:
    """Spec-Bench's model id of a configuration: `<model id>-temperature-<t>`."""
    return f"{model_id(pair, label)}-temperature-{float(temperature)}"


def answer_lines(rows: pd.DataFrame, model: str) -> list[dict]:
    """One line per question, sorted by question id."""
    lines = []
    for row in rows.sort_values("sample_id").to_dict("records"):
        accepted = [int(a) for a in row["accepted_per_block"]]
        lines.append({
            "question_id": f"{row['sample_id']}", "category": row["dataset"], "model_id": model,
            "choices": [{"index": 0, "turns": [row["output_text"]], "new_tokens": [int(row["new_tokens"])],
                         "wall_time": [float(row["wall_s"])], "decoding_steps": [len(accepted)],
                         "accept_lengths": [a + 1 for a in accepted]}],
        })
    return lines


WRITERS = {"spec-bench": spec_bench_lines, "mmspec": mmspec_records,
           "speculation-profile": speculation_profiles}
FORMATS = tuple(WRITERS)


def export(rows: pd.DataFrame, folder: str | Path, fmt: str = "spec-bench") -> list[Path]:
    """Write `rows` in `fmt` under `folder`; the paths written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in sorted(WRITERS[fmt](rows).items()):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        # a list is JSON Lines (one answer or conversation a line), a dict one JSON document
        path.write_text("".join(json.dumps(line) + "\n" for line in content) if isinstance(content, list)
                        else json.dumps(content, indent=2) + "\n")
        written.append(path)
    return written
