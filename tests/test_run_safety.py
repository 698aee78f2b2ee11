"""What keeps a run's results whole without Ray: resume sorting (stale prompts, retryable
errors), rows dropped atomically, the run lock, checks that fail before Ray starts, and a
worker that turns one configuration's crash into an error row."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipeline.decoding.config import DecodeConfig
from pipeline.data.sample import Sample
from pipeline.planning.grid import ModelGroup, Pair, RunConfig, Shard, WorkUnit
from pipeline.planning.resume import OLD_KEY, PROMPT_CHANGED, reconcile, wanted_rows
from pipeline.storage.run_lock import RunLocked, run_lock
from pipeline.storage.store import drop_rows, read_results, run_dir, write_shard, written_rows
from tests.test_results import record
from pipeline.storage.schema import make_row
from pipeline.storage.store import rows_to_table

ROOT = Path(__file__).resolve().parents[1]
PAIR = Pair("tiny:target", "tiny:draft")


def sample(i: int, prompt: str = "USER: <image>\nq? ASSISTANT:", colour=(200, 0, 0)) -> Sample:
    return Sample("toy", "test", i, "first", prompt, (Image.new("RGB", (8, 8), colour),))


def rows_for(config: RunConfig, samples: list[Sample], shard: str, errors: dict[int, str] | None = None) -> list[dict]:
    rows = []
    for s in samples:
        rec = record(s.sample_id, "answer", None)
        if errors and s.row in errors:
            rec.error, rec.error_category = "boom", errors[s.row]
        rows.append(make_row("r", shard, config, s, rec))
    return rows


def test_prompt_hash_covers_text_pixels_and_error():
    base = sample(0)
    assert base.prompt_hash == sample(0).prompt_hash
    assert base.prompt_hash != sample(0, prompt="USER: <image>\nother? ASSISTANT:").prompt_hash
    assert base.prompt_hash != sample(0, colour=(0, 0, 200)).prompt_hash  # same text, another image
    broken = Sample("toy", "test", 0, "first", base.prompt, (), error="image 0 is missing")
    assert broken.prompt_hash != base.prompt_hash  # restoring the image changes the key


def test_resume_keeps_good_rows_and_recomputes_stale_and_retryable_ones(tmp_path):
    config = RunConfig(PAIR, DecodeConfig("M"))
    old = [sample(0), sample(1), sample(2), sample(3)]
    write_shard(tmp_path, rows_to_table(rows_for(config, old[:2], "s1", errors={1: "input"})))
    write_shard(tmp_path, rows_to_table(rows_for(config, old[2:], "s2", errors={3: "resource"})))
    write_shard(tmp_path, rows_to_table(rows_for(RunConfig(PAIR, DecodeConfig("T")), old[:1], "s3")))  # not in the grid below
    now = [sample(0), sample(1), sample(2, colour=(0, 200, 0)), sample(3)]  # sample 2's image changed
    unit = WorkUnit(config, "toy", "first")
    resume = reconcile(written_rows(tmp_path, "r", ["first"]), wanted_rows([unit], lambda u: now))
    keys = {s.row: make_row("r", "x", config, s, record(s.sample_id, "", None))["key"] for s in old}
    assert resume.keep == {keys[0], keys[1]} and resume.kept_errors == {"input": 1}
    assert resume.recompute == {keys[2]: PROMPT_CHANGED, keys[3]: "retrying resource errors"}
    assert resume.other == 1
    assert any("1 rows are computed again: made from another prompt" in line for line in resume.lines())
    # dropping rewrites only the affected file, atomically, and keeps everything else
    assert drop_rows(tmp_path, "r", set(resume.recompute)) == 2
    df = read_results(tmp_path, "r")
    assert sorted(df.key) == sorted([keys[0], keys[1], *df.key[df.methods == "T"]])
    assert not [p for p in run_dir(tmp_path, "r").rglob("*") if p.name.startswith(".")]
    assert len(list(run_dir(tmp_path, "r").rglob("part-s2.parquet"))) == 0  # emptied file removed


def test_rows_written_before_prompt_hashes_are_recomputed(tmp_path):
    config = RunConfig(PAIR, DecodeConfig("M"))
    path = write_shard(tmp_path, rows_to_table(rows_for(config, [sample(0)], "s1")))
    table = pq.read_table(path).drop_columns(["prompt_hash", "error_category"])
    pq.write_table(table.set_column(0, "key", pa.array(["old-format-key"])), path)
    resume = reconcile(written_rows(tmp_path, "r", ["first"]), wanted_rows([WorkUnit(config, "toy", "first")], lambda u: [sample(0)]))
    assert resume.recompute == {"old-format-key": OLD_KEY} and not resume.keep


def test_a_second_driver_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a live "driver"
    lock = run_dir(tmp_path, "r") / ".lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": other.pid, "since": "earlier"}))
    try:
        with pytest.raises(RunLocked, match=f"being written by pid {other.pid} on {socket.gethostname()} since earlier"):
            with run_lock(tmp_path, "r"):
                pass
    finally:
        other.kill()
        other.wait()
    with run_lock(tmp_path, "r") as held:  # its driver died on this host: taken over
        assert json.loads(held.read_text())["pid"] == os.getpid()
        with run_lock(tmp_path, "r"):  # the job holds it and its runner takes it again: nested
            pass
        assert held.exists()
    assert not lock.exists()


def test_one_configuration_that_crashes_is_an_error_row(tiny_dirs, monkeypatch):
    import actors.target_worker as worker_module
    import pipeline.execution.shard_records as records_module

    pair = Pair(tiny_dirs["target"], tiny_dirs["draft"])
    group = ModelGroup(pair.target, pair.dtype, (pair.draft,))
    worker = worker_module.TargetWorker(group)
    s = Sample("toy", "test", 0, "first", "USER: <image>\nWhat? ASSISTANT:", (Image.new("RGB", (30, 30), "red"),))
    ok, bad = RunConfig(pair, DecodeConfig("M", gamma=2, max_new_tokens=4)), RunConfig(pair, DecodeConfig("MT", gamma=2, max_new_tokens=4))
    real = records_module.speculative_decode

    def crash_on_mt(target, draft, sample, config, *args, **kwargs):
        if config.methods == "MT":
            raise RuntimeError(f"probability tensor contains inf, nan or element < 0 in {object()}")
        return real(target, draft, sample, config, *args, **kwargs)

    monkeypatch.setattr(records_module, "speculative_decode", crash_on_mt)
    shard = Shard("r", group, "toy", "first", "live", ((ok, s.sample_id), (bad, s.sample_id)), ((s.sample_id, s.prompt_hash),))
    rows = worker.run_shard(shard, {s.sample_id: s}).to_pylist()
    assert rows[0]["error"] is None and rows[0]["new_tokens"] > 0
    assert rows[0]["replay_accepted_per_block"] == rows[0]["accepted_per_block"]  # checked against replay
    assert rows[1]["replay_accepted_per_block"] is None  # a failed live row has nothing to check
    assert rows[1]["error_category"] == "model" and " at 0x" not in rows[1]["error"]
    assert rows[1]["error"].startswith("RuntimeError: probability tensor")
    # a sample that cannot be traced fails its AR row as "ar", its SD rows as "replay"
    broken = Sample("toy", "test", 1, "first", "USER: <image>\nWhat? ASSISTANT:")
    ar = RunConfig(pair, DecodeConfig("AR", gamma=None, max_new_tokens=4))
    shard = Shard("r", group, "toy", "first", "replay", ((ar, broken.sample_id), (ok, broken.sample_id)),
                  ((broken.sample_id, broken.prompt_hash),))
    rows = worker.run_shard(shard, {broken.sample_id: broken}).to_pylist()
    assert [(r["mode"], r["error_category"]) for r in rows] == [("ar", "input"), ("replay", "input")]


# -- checks before Ray -------------------------------------------------------------------

def grid_file(tmp_path: Path, **fields) -> Path:
    grid = {"name": "g", "datasets": ["embedded_vqa"], "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}],
            "methods": ["AR", "M"], "limit": 2, **fields}
    path = tmp_path / "grid.yaml"
    path.write_text(json.dumps(grid))  # JSON is YAML
    return path


def run_job(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**(os.environ if env is None else env), "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}
    code = ("import sys, runpy; sys.argv = ['full_grid.py', *sys.argv[1:]]\n"
            "try:\n    runpy.run_path('jobs/full_grid.py', run_name='__main__')\n"
            "except SystemExit as e:\n    print('HEAVY', sorted(m for m in ('ray', 'transformers', 'datasets', 'torch') if m in sys.modules), file=sys.stderr)\n"
            "    raise\n")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("text,message", [
    ("name: x\ndatasets: [embedded_vqa\n", "is not valid YAML at line 3, column 1"),
    ("datasets: [embedded_vqa]\npairs: [{target: 'tiny:target', draft: 'tiny:draft'}]\nmethods: [M]\n"
     "temperature: [.nan]\n", "temperature[0]: expected a finite number"),
])
def test_a_broken_grid_fails_in_one_line_without_heavy_imports(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    done = run_job("--grid", str(bad))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and message in lines[0] and lines[1:] == ["HEAVY []"], done.stderr


@pytest.mark.parametrize("case,message", [
    ("out_is_a_file", "--out"),
    ("empty_parquet", "holds no rows"),
    ("columnless_parquet", "lacks column(s)"),
    ("not_parquet", "neither a datasets.save_to_disk directory nor Parquet"),
    ("embedded_with_source", "takes no source"),
    ("offline_hub_id", "not in the local hub cache"),
])
def test_input_problems_fail_before_ray_with_one_line(tmp_path, case, message):
    fields, out = {}, tmp_path / "out"
    if case == "out_is_a_file":
        out.write_text("not a directory")
    elif case in ("empty_parquet", "columnless_parquet", "not_parquet"):
        copy = tmp_path / "docvqa.parquet"
        if case == "empty_parquet":
            pq.write_table(pa.table({"question": pa.array([], pa.string()), "image": pa.array([], pa.binary())}), copy)
        elif case == "columnless_parquet":
            pq.write_table(pa.table({"text": ["a row without the columns docvqa needs"]}), copy)
        else:
            copy = tmp_path / "notes"
            copy.mkdir()
            (copy / "readme.txt").write_text("hello")
        fields = {"datasets": ["docvqa"], "sources": {"docvqa": str(copy)}}
    elif case == "embedded_with_source":
        fields = {"sources": {"embedded_vqa": str(tmp_path)}}
    elif case == "offline_hub_id":
        fields = {"pairs": [{"target": "nobody/not-cached-llava", "draft": "tiny:draft"}]}
    done = run_job("--grid", str(grid_file(tmp_path, **fields)), "--out", str(out))
    lines = [line for line in done.stderr.splitlines() if not line.startswith("HEAVY")]
    assert done.returncode == 2 and message in done.stderr and len(lines) == 1, done.stderr
    heavy = done.stderr.split("HEAVY")[-1]
    assert "'ray'" not in heavy and "'transformers'" not in heavy  # never Ray or transformers


def test_ctrl_c_ends_with_how_to_resume(tmp_path, monkeypatch, capsys):
    import ray

    import actors.runner
    from jobs import full_grid

    def interrupted(runner):
        runner.report.rows_written = 7
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: None)
    monkeypatch.setattr(full_grid, "watch_gcs", lambda *args: threading.Event())  # no Ray, so no GCS to watch
    monkeypatch.setattr(actors.runner.GridRunner, "run", interrupted)
    code = full_grid.main(["--grid", str(grid_file(tmp_path)), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == full_grid.EXIT_INTERRUPTED and "interrupted; rerun the same command to resume (7 rows" in err
    assert "Traceback" not in err


def test_a_second_driver_is_refused_before_ray_starts(tmp_path):
    out = tmp_path / "out"
    with run_lock(out, "g"):
        done = run_job("--grid", str(grid_file(tmp_path)), "--out", str(out))
    assert done.returncode == 3 and f"being written by pid {os.getpid()}" in done.stderr, done.stderr
    assert "'ray'" not in done.stderr.split("HEAVY")[-1]


def test_a_run_that_stopped_early_is_called_incomplete(tmp_path):
    from pipeline.reports.completeness import completeness_table, completeness_text
    from pipeline.storage.manifest import read_manifest, write_manifest

    config = RunConfig(PAIR, DecodeConfig("M"))
    write_shard(tmp_path, rows_to_table(rows_for(config, [sample(0), sample(1)], "s1", errors={1: "input"})))
    expected = [{"target": PAIR.target, "draft": PAIR.draft, "dtype": "fp32", "turn": "first", "rows": 5}]
    write_manifest(tmp_path, "r", {"grid": "g", "expected": expected})
    assert read_manifest(tmp_path, "r")["expected"] == expected and read_manifest(tmp_path, "other") is None
    rows = read_results(tmp_path, "r")
    table = completeness_table(rows, expected)
    assert table[["expected", "present", "failed", "missing"]].values.tolist() == [[5, 2, 1, 3]]
    text = completeness_text(table, expected)
    assert text.startswith("**INCOMPLETE: 3 of 5 expected rows are missing.**") and "resume" in text
    done = [{**expected[0], "rows": 2}]
    assert completeness_text(completeness_table(rows, done), done).startswith("Complete: all 2 expected rows")
    assert "unknown" in completeness_text(completeness_table(rows, None), None)


def test_a_hub_id_that_cannot_be_resolved_fails_before_ray_in_seconds(tmp_path):
    """With the hub on but unreachable, a model the actors could never download is refused by
    preflight, not 38 s later by an actor after Ray has started."""
    import time

    with socket.socket() as probe:  # a local port nothing listens on: connections are refused at once
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    fields = {"pairs": [{"target": "nobody/unreachable-llava", "draft": "tiny:draft"}]}
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"} | {"HF_ENDPOINT": f"http://127.0.0.1:{closed}"}
    start = time.monotonic()
    done = run_job("--grid", str(grid_file(tmp_path, **fields)), "--out", str(tmp_path / "out"), env=env)
    seconds = time.monotonic() - start
    assert done.returncode == 2 and "pairs[0].target: cannot reach the hub" in done.stderr, done.stderr
    assert "'ray'" not in done.stderr.split("HEAVY")[-1] and seconds < 60


def _take_over_together(out: str, start, done, released, taken, trials: int) -> None:
    """One of several drivers started together over a stale lock, `trials` times; judging a lock
    stale is slowed down so that every driver reads the stale lock before any takes it over."""
    import pipeline.storage.run_lock as module

    judged = module._live_holder

    def slowly(path):
        holder = judged(path)
        time.sleep(0.02)
        return holder

    module._live_holder = slowly
    for _ in range(trials):
        start.wait()
        try:
            with run_lock(out, "r"):
                taken.put(os.getpid())
                done.wait()  # hold it while the others try
        except RunLocked:
            done.wait()
        released.wait()


def test_drivers_starting_together_over_a_stale_lock_take_it_once(tmp_path):
    import multiprocessing

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    context, drivers, trials = multiprocessing.get_context("fork"), 4, 10
    start, done, released = (context.Barrier(drivers + 1) for _ in range(3))
    taken = context.Queue()
    workers = [context.Process(target=_take_over_together,
                               args=(str(tmp_path), start, done, released, taken, trials)) for _ in range(drivers)]
    for worker in workers:
        worker.start()
    holders = []
    for _ in range(trials):
        stale = run_dir(tmp_path, "r") / ".lock"
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "since": "earlier"}))
        start.wait(timeout=60)
        time.sleep(0.3)
        holders.append(taken.qsize())
        done.wait(timeout=60)
        released.wait(timeout=60)
        while not taken.empty():
            taken.get()
    for worker in workers:
        worker.join(timeout=60)
    assert holders == [1] * trials  # unlinking the stale lock, then linking one's own, let two hold it
    assert not [p for p in run_dir(tmp_path, "r").iterdir() if p.name.startswith(".lock")]
