"""The Spec-Bench export round-trips through readers written from Spec-Bench's own scripts:
`evaluation/speed.py`'s `speed()` (per question `sum(new_tokens) / sum(wall_time)`, averaged
over questions; the baseline's tokens counted by re-tokenizing its `turns`, minus one for the
BOS token; `accept_lengths` pooled for "mean accepted tokens"; `category` filters a task) and
`evaluation/equal.py` (each line's `str(turns)`, compared line by line)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.decoding.config import DecodeConfig
from pipeline.reports.export import export

ROOT = Path(__file__).resolve().parents[1]


def row(mode: str, label: str, sample: int, accepted: list[int], wall: float, *, dataset="pope", draft="d",
        timed=True) -> dict:
    tokens = len(accepted) + sum(accepted)
    return {"target": "org/target", "draft": draft, "dtype": "fp16", "mode": mode, "method_label": label,
            "verify": None if mode == "ar" else "chain", "sample_id": f"{dataset}/test/{sample}/first",
            "dataset": dataset, "error": None, "output_text": " ".join(["word"] * tokens), "new_tokens": tokens,
            "accepted_per_block": accepted, "time_wall_s": wall, "time_total_s": wall * 0.9, "timed": timed,
            "temperature": 0.0}


def bos_and_words(text: str) -> list[int]:
    """A tokenizer's input_ids for `speed()`: a BOS token, then one token per word."""
    return [1] + [2] * len(text.split())


def spec_bench_speed(sd: Path, base: Path, task: str = "overall") -> tuple[float, float, float]:
    """Spec-Bench's `speed()`: (mean accepted tokens, tokens/s, speedup ratio over the baseline)."""
    def points(path):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return [p for p in lines if task == "overall" or p["category"] == task]

    speeds, accept = [], []
    for point in points(sd):
        choice = point["choices"][0]
        speeds.append(sum(choice["new_tokens"]) / sum(choice["wall_time"]))
        accept.extend(choice["accept_lengths"])
    base_speeds = [sum(len(bos_and_words(t)) - 1 for t in p["choices"][0]["turns"]) / sum(p["choices"][0]["wall_time"])
                   for p in points(base)]
    return float(np.mean(accept)), float(np.mean(speeds)), float(np.mean(speeds) / np.mean(base_speeds))


def spec_bench_equal(first: Path, second: Path) -> bool:
    """Spec-Bench's `equal.py`: "Result totally Equal!" when every line pair's turns agree."""
    contents = [[str(json.loads(line)["choices"][0]["turns"]) for line in path.read_text().splitlines()]
                for path in (first, second)]
    return all(a == b for a, b in zip(*contents))


def test_the_spec_bench_export_round_trips(tmp_path):
    rows = pd.DataFrame([
        row("live", "MT*", 1, [0, 2], 0.25, dataset="vist"), row("live", "MT*", 0, [3, 1, 4], 0.5),
        row("ar", "AR", 1, [0] * 4, 1.0, dataset="vist"), row("ar", "AR", 0, [0] * 11, 2.0),
        row("ar", "AR", 0, [0] * 11, 9.0, timed=False),  # the same question decoded untimed: not the baseline
        row("ar", "AR", 0, [0] * 11, 7.0, draft="other", timed=False),  # another pair's
        row("ar", "AR", 3, [0] * 6, 1.0, timed=False),  # a question no configuration of the pair has
        row("replay", "MT*", 2, [5, 5], 0.0),  # no walltime of its own: not exported
    ])
    written = sorted(p.name for p in export(rows, tmp_path))
    # Spec-Bench's scripts' `<model id>-temperature-<t>.jsonl`, the model id in each line the file's name
    sd_name = "org%2Ftarget__d__fp16__MT%2A-temperature-0.0.jsonl"
    ar_name = "org%2Ftarget__d__fp16__AR-temperature-0.0.jsonl"
    assert written == [ar_name, sd_name]  # no file for a pair with no live rows
    assert {json.loads(line)["model_id"] for line in (tmp_path / sd_name).read_text().splitlines()} == {
        sd_name.removesuffix(".jsonl")}
    sd, ar = tmp_path / sd_name, tmp_path / ar_name
    for path in (sd, ar):  # one line per question, sorted, the same questions in both
        ids = [json.loads(line)["question_id"] for line in path.read_text().splitlines()]
        assert ids == ["pope/test/0/first", "vist/test/1/first"]
    accept, speed, speedup = spec_bench_speed(sd, ar)
    assert accept == pytest.approx(1 + (3 + 1 + 4 + 0 + 2) / 5)  # our pooled tau
    assert speed == pytest.approx(np.mean([11 / 0.5, 4 / 0.25]))
    assert speedup == pytest.approx(np.mean([11 / 0.5, 4 / 0.25]) / np.mean([11 / 2.0, 4 / 1.0]))
    assert spec_bench_speed(sd, ar, task="vist") == pytest.approx((1 + 2 / 2, 4 / 0.25, (4 / 0.25) / (4 / 1.0)))
    assert spec_bench_equal(sd, ar)  # the same answers, line for line
    changed = ar.read_text().replace("word", "other", 1)
    (tmp_path / "changed.jsonl").write_text(changed)
    assert not spec_bench_equal(sd, tmp_path / "changed.jsonl")


def test_the_export_job_writes_beside_the_run(tmp_path):
    from pipeline.storage.schema import make_row
    from pipeline.storage.store import rows_to_table, write_shard
    from tests.test_run_safety import PAIR, RunConfig, sample
    from tests.test_results import record

    rec = record("toy/test/0/first")
    rec.mode, rec.time_wall_s = "live", 0.3
    write_shard(tmp_path, rows_to_table([make_row("r", "s1", RunConfig(PAIR, DecodeConfig("M")), sample(0), rec)]))
    done = subprocess.run([sys.executable, "jobs/export.py", str(tmp_path), "--format", "spec-bench"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "run r: 1 file(s)" in done.stdout, done.stderr
    (exported,) = (tmp_path / "_export-r" / "spec-bench").iterdir()
    assert json.loads(exported.read_text())["choices"][0]["accept_lengths"] == [3, 1]  # no AR row: no baseline


def test_a_row_written_before_the_wall_clock_exports_its_phase_total(tmp_path):
    old = {**row("live", "M", 0, [1], 0.0), "time_wall_s": float("nan"), "time_total_s": 0.4}
    (written,) = export(pd.DataFrame([old]), tmp_path)
    assert json.loads(written.read_text())["choices"][0]["wall_time"] == [0.4]  # never NaN, which is not JSON


FILE_RE = re.compile(r"^(?P<name>.+)-temperature-(?P<temp>[^-]+)\.jsonl$")  # summarize_metrics' discovery


def mmspec_turns(path: Path) -> list[dict]:
    """MMSpec's `summarize_metrics._iter_turns`: one dict per (conversation, turn)."""
    out = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        choice = record["choices"][0]
        accept = choice.get("acceptance_length", [])
        for t, tokens in enumerate(choice["new_tokens"]):
            out.append({"qid": record["question_id"], "turn": t, "new_tokens": tokens,
                        "wall_time": choice["wall_time"][t], "accept": accept[t] if t < len(accept) else None})
    return out


def mmspec_summary(method: list[dict], base: list[dict]) -> tuple[float, float, float]:
    """(MAT, speedup_paired, speedup_global) as its summarizer computes them."""
    rounds = sum(len(r["accept"]) if isinstance(r["accept"], list) else r["new_tokens"] for r in method)
    mat = sum(r["new_tokens"] for r in method) / rounds
    by_turn = {(r["qid"], r["turn"]): r for r in base}
    ratios = [(r["new_tokens"] / r["wall_time"]) / (b["new_tokens"] / b["wall_time"])
              for r in method if (b := by_turn.get((r["qid"], r["turn"])))]
    rate = lambda rs: sum(r["new_tokens"] for r in rs) / sum(r["wall_time"] for r in rs)
    return mat, sum(ratios) / len(ratios), rate(method) / rate(base)


def test_the_mmspec_export_reads_as_its_summarizer_reads_it(tmp_path):
    second = lambda r: {**r, "sample_id": r["sample_id"].replace("/first", "/qaorg"), "turn": "qaorg"}
    first_m, first_ar = row("live", "M", 0, [3, 1], 0.5), row("ar", "AR", 0, [0] * 6, 1.0)
    rows = pd.DataFrame([
        {**first_m, "turn": "first"}, second({**row("live", "M", 0, [0, 2, 2], 0.6), "turn": "first"}),
        {**row("live", "M", 1, [4], 0.2), "turn": "first"},
        {**first_ar, "turn": "first"}, second({**row("ar", "AR", 0, [0] * 8, 1.6), "turn": "first"}),
        {**row("ar", "AR", 1, [0] * 5, 0.5), "turn": "first"},
    ])
    written = export(rows, tmp_path, "mmspec")
    folder = tmp_path / "org%2Ftarget__d__fp16"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "org%2Ftarget__d__fp16/M-temperature-0.jsonl", "org%2Ftarget__d__fp16/baseline-temperature-0.jsonl"]
    assert all(FILE_RE.match(p.name) for p in written)  # found by its summarizer's default, --temperature 0
    records = [json.loads(line) for line in (folder / "M-temperature-0.jsonl").read_text().splitlines()]
    assert [r["question_id"] for r in records] == ["pope/test/0/qaorg", "pope/test/1/first"]  # a conversation each
    assert records[0]["choices"][0]["acceptance_length"] == [[3, 1], [0, 2, 2]]  # no bonus token
    assert records[0]["choices"][0]["new_tokens"] == [6, 7]
    method, base = mmspec_turns(folder / "M-temperature-0.jsonl"), mmspec_turns(folder / "baseline-temperature-0.jsonl")
    mat, paired, overall = mmspec_summary(method, base)
    assert mat == pytest.approx(1 + (3 + 1 + 0 + 2 + 2 + 4) / 6)  # our tau, pooled over blocks
    assert paired == pytest.approx(np.mean([(6 / 0.5) / (6 / 1.0), (7 / 0.6) / (8 / 1.6), (5 / 0.2) / (5 / 0.5)]))
    assert overall == pytest.approx((18 / 1.3) / (19 / 3.1))
    assert mmspec_summary(base, base)[0] == 1.0  # a baseline turn costs a round per token


def test_our_speedup_table_gives_mmspecs_two_speedups(tmp_path):
    from pipeline.reports.speedup import speedup_table
    from tests.results_fixture import calibrations_of

    timing = {"turn": "first", "engine": "static", "policy": "static", "blocks": 1, "device_name": "cpu",
              "steps": "uncompiled", "torch_version": "2", "transformers_version": "5"}
    rows = pd.DataFrame([{**r, **timing, "gamma": 5.0 if r["mode"] == "live" else None} for r in [
        row("live", "M", 0, [3, 1], 0.5), row("live", "M", 1, [4], 0.2), row("live", "M", 2, [1, 1, 1], 0.4),
        row("ar", "AR", 0, [0] * 6, 1.0), row("ar", "AR", 1, [0] * 5, 0.5),
        row("ar", "AR", 2, [0] * 5, 0.6)]])
    written = export(rows, tmp_path, "mmspec")
    method, base = (mmspec_turns(next(p for p in written if p.name.startswith(name)))
                    for name in ("M-", "baseline"))
    _, paired, overall = mmspec_summary(method, base)
    ours = speedup_table(rows, calibrations_of([])).xs("M", level="method_label").iloc[0]
    assert (ours["paired"], ours["global"]) == pytest.approx((paired, overall))
    assert ours["global"] != pytest.approx(ours["measured"])  # SD answered with more tokens than AR here
