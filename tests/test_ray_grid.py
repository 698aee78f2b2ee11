"""The grid on a local Ray (2 CPUs, 2 logical GPUs) with the tiny pair: rows = units x samples
with engine-identical values, a killed actor loses no row, an interrupted run resumes with
only the missing shards, replay rows equal live ones. The worker itself, without Ray: each
configuration decodes on the engine its grid named."""
from __future__ import annotations

from dataclasses import replace

import dataclasses
import io
import os
import time

import pandas as pd
import pytest
from PIL import Image

from actors.runner import GridRunner
from actors.worker_pool import RunFailed
from pipeline.decoding.config import DecodeConfig
from pipeline.data.sample import Sample
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.planning.grid import Catalog, ModelGroup, Pair, RunConfig, Shard
from pipeline.planning.grid_file import parse_grid
from pipeline.execution.shard_records import WARM_UP_TOKENS
from pipeline.storage.store import read_results

pytestmark = pytest.mark.slow

CATALOG = Catalog(datasets=("toy",), turn_tasks=("again",))
QUESTIONS = ["What is shown?", "Describe the picture.", "What colour is it?", "Is there a dog?"]
COLOURS = [(220, 20, 20), (20, 20, 220), (20, 200, 20), (240, 240, 20)]
# Columns that must not depend on which process, attempt or decoding mode produced a row.
RESULT_COLUMNS = ["key", "sample_id", "turn", "methods", "policy", "gamma", "output_ids", "accepted_per_block",
                  "weights_per_block", "tau", "error"]


class ToySource:
    """Four single-image samples and one broken one (no image for its placeholder)."""

    def first_turn(self, dataset: str, limit: int | None) -> list[Sample]:
        samples = [
            Sample("toy", "test", i, "first", f"USER: <image>\n{q} ASSISTANT:", (Image.new("RGB", (60, 50), c),))
            for i, (q, c) in enumerate(zip(QUESTIONS, COLOURS))
        ]
        samples.append(Sample("toy", "test", 4, "first", "USER: <image>\nWhat is it? ASSISTANT:"))
        return samples[:limit]

    def second_turn(self, first_samples, first_outputs, task):
        out = []
        for s in first_samples:
            answer = first_outputs.get(s.sample_id)
            prompt = f"{s.prompt} {answer}</s>USER: Tell me more. ASSISTANT:"
            error = None if answer is not None else f"no first-turn answer for {s.sample_id}"
            out.append(dataclasses.replace(s, turn=task, prompt=prompt, error=error))
        return out


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory):
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    tiny_cache = str(tmp_path_factory.mktemp("tiny_cache"))
    ray.init(
        address="local",  # a fresh Ray even if a `ray start` cluster is around
        num_cpus=2, num_gpus=2, _node_ip_address="127.0.0.1", include_dashboard=False,
        runtime_env={"env_vars": {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1", "TABED_TINY_DIR": tiny_cache}},
    )
    yield ray
    ray.shutdown()


def spec(tiny_dirs, mode="live", draft=None, **pair):
    return parse_grid(
        {
            "name": "toy",
            "datasets": ["toy"],
            "turns": ["first", "again"],
            "pairs": [{"target": tiny_dirs["target"], "draft": draft or tiny_dirs["draft"], **pair}],
            "methods": ["AR", "M", "MT"],
            "policies": ["static", {"kind": "grid"}],
            "gamma": [3],
            "max_new_tokens": 12,
            "shard_size": 2,
            "mode": mode,
        },
        CATALOG,
    )


def run(tiny_dirs, out, mode="live", workers=1, **kwargs):
    # one actor unless a test needs more: on 2 cores, actor start-up (imports) dominates tiny decoding
    runner = GridRunner(spec(tiny_dirs, mode), out, source=ToySource(), workers=workers, stream=io.StringIO(), **kwargs)
    return runner, runner.run()


def results(out) -> pd.DataFrame:
    df = read_results(out)
    return df.sort_values("key").reset_index(drop=True)


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    df = df[RESULT_COLUMNS].copy()
    for column in ("output_ids", "accepted_per_block", "weights_per_block"):
        df[column] = df[column].map(lambda v: repr([list(x) if hasattr(x, "__len__") else x for x in v]))
    return df


@pytest.fixture(scope="module")
def full_run(ray_local, tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    runner, report = run(tiny_dirs, out, workers=2)
    return out, runner, report


def test_rows_equal_units_times_samples_and_engine_values(full_run, tiny_dirs, tiny_pair):
    out, runner, report = full_run
    df = results(out)
    units = runner.spec.units()
    assert len(df) == len(units) * 5 == report.rows_written and df.key.is_unique
    assert report.rows_skipped == 0 and report.redispatched == 0
    assert (df["mode"][df.methods == "AR"] == "ar").all() and (df["mode"][df.methods != "AR"] == "live").all()
    target, draft = tiny_pair
    source = ToySource()
    first = source.first_turn("toy", None)
    answers = {s.sample_id: autoregressive_decode(target, [s], max_new_tokens=12)[0].output_text for s in first[:4]}
    samples = {s.sample_id: s for s in first + source.second_turn(first, answers, "again")}
    configs = {c.key(): c for c in runner.spec.configs()}
    for row in df.itertuples():
        config, sample = configs[row.config_key], samples[row.sample_id]
        if sample.row == 4:  # the broken sample is an error row (and so its second turn); the job went on
            expected_error = "placeholder" if sample.turn == "first" else "no first-turn answer"
            assert expected_error in row.error and row.blocks == 0
            continue
        if config.decode.is_ar:
            expected = autoregressive_decode(target, [sample], max_new_tokens=12)[0]
        else:
            expected = speculative_decode(target, draft, [sample], config.decode)[0]
        assert pd.isna(row.error), row.error
        assert list(row.output_ids) == expected.output_ids and row.output_text == expected.output_text
        assert list(row.accepted_per_block) == expected.accepted_per_block
        assert [list(w) for w in row.weights_per_block] == expected.weights_per_block
        assert row.tau == pytest.approx(expected.tau) and row.time_total_s > 0


def test_two_drafts_of_one_target_each_get_all_their_rows(ray_local, tiny_dirs, tmp_path):
    """Draft size as an axis: one model group, its shards hold both drafts' rows, and each
    draft's rows land in its own partition, complete."""
    from pipeline.reports.summary import write_summary

    two = dataclasses.replace(spec(tiny_dirs, mode="auto"), live_samples=1, limit=4,  # no broken sample
                              pairs=(Pair(tiny_dirs["target"], tiny_dirs["draft"]), Pair(tiny_dirs["target"], tiny_dirs["target"])))
    report = GridRunner(two, tmp_path, source=ToySource(), workers=2, stream=io.StringIO()).run()
    df = results(tmp_path)
    assert len(df) == len(two.units()) * 4 == report.rows_written and df.key.is_unique and df.error.isna().all()
    assert df.groupby("draft").size().to_dict() == {tiny_dirs["draft"]: len(df) // 2, tiny_dirs["target"]: len(df) // 2}
    assert "Complete: all" in write_summary(tmp_path, "toy", read_results(tmp_path, "toy"))
    assert (df.groupby(["sample_id", "turn"])["output_ids"].agg(lambda ids: len({tuple(i) for i in ids})) == 1).all()
    timed = df[df.timed & (df["mode"] == "live")]
    assert len(timed) == 2 * 3 and timed.groupby("draft")["sample_id"].agg(frozenset).nunique() == 1  # same sample
    assert (timed.replay_accepted_per_block.map(list) == timed.accepted_per_block.map(list)).all()


def test_killed_actors_lose_no_row(ray_local, tiny_dirs, full_run, tmp_path):
    kills = []

    def kill(path, runner):
        # first a kill Ray restarts (in-flight calls retried), then one it may not (re-dispatch)
        if len(kills) < 2 and runner.workers:
            worker = runner.workers[0]
            ray_local.kill(worker.handle, no_restart=bool(kills))
            kills.append(worker)

    _, report = run(tiny_dirs, tmp_path, on_shard_written=kill)
    assert len(kills) == 2 and report.redispatched >= 1
    pd.testing.assert_frame_equal(comparable(results(tmp_path)), comparable(results(full_run[0])))


def test_interrupted_run_resumes_with_only_the_missing_shards(ray_local, tiny_dirs, full_run, tmp_path):
    def interrupt(path, runner):
        if runner.report.shards_written == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tiny_dirs, tmp_path, on_shard_written=interrupt)
    assert len(results(tmp_path)) > 0
    from pipeline.reports.summary import write_summary

    assert "**INCOMPLETE: " in write_summary(tmp_path, "toy", read_results(tmp_path, "toy"))
    written_before = len(list(tmp_path.rglob("part-*.parquet")))
    _, report = run(tiny_dirs, tmp_path)
    total = full_run[2].shards_written
    assert written_before == 3 and report.shards_written == total - 3 and report.rows_skipped > 0
    pd.testing.assert_frame_equal(comparable(results(tmp_path)), comparable(results(full_run[0])))
    _, again = run(tiny_dirs, tmp_path)  # nothing left: nothing recomputed, nothing duplicated
    assert again.shards_written == 0 and len(results(tmp_path)) == len(results(full_run[0]))


def test_auto_mode_replays_greedy_configs_with_live_results(ray_local, tiny_dirs, full_run, tmp_path):
    _, report = run(tiny_dirs, tmp_path, mode="auto")
    df = results(tmp_path)
    assert set(df["mode"][df.methods != "AR"]) == {"replay"}
    assert (df.groupby("shard")["config_key"].nunique() > 1).all()  # greedy configs share shards
    live = results(full_run[0])
    live_sd = live[(live.methods != "AR") & live.error.isna()]
    assert all(list(a) == list(r) for a, r in zip(live_sd["accepted_per_block"], live_sd["replay_accepted_per_block"]))
    pd.testing.assert_frame_equal(comparable(df), comparable(results(full_run[0])))


def test_a_pair_that_cannot_load_stops_the_run_with_its_error(ray_local, tiny_dirs, tmp_path):
    bad = spec(tiny_dirs, draft="nobody/missing-draft")  # a well-formed hub id that is not there (offline)
    runner = GridRunner(bad, tmp_path, source=ToySource(), workers=1, stream=io.StringIO())
    with pytest.raises(RuntimeError, match="(?s)could not start.*nobody/missing-draft"):
        runner.run()
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_pair_given_two_gpus_runs_on_one_worker_holding_both(ray_local, tiny_dirs, full_run, tmp_path):
    """`gpus: 2` (a target too large for one GPU, spread over two): its worker holds both of the
    cluster's GPUs, so no second worker starts beside it though two are allowed, and its rows
    equal a run on one-GPU workers. A pair asking for more GPUs than any node has stops the run
    before any worker starts, naming the pair."""
    import ray

    held = []  # (workers, GPUs free) as each shard is written

    def record(path, runner):
        held.append((len(runner.workers), ray.available_resources().get("GPU", 0.0)))

    GridRunner(spec(tiny_dirs, gpus=2), tmp_path / "two", source=ToySource(), workers=2, stream=io.StringIO(),
               on_shard_written=record).run()
    assert held and set(held) == {(1, 0.0)}
    pd.testing.assert_frame_equal(comparable(results(tmp_path / "two")), comparable(results(full_run[0])))
    started = time.monotonic()
    too_many = GridRunner(spec(tiny_dirs, gpus=3), tmp_path / "three", source=ToySource(), stream=io.StringIO())
    with pytest.raises(RunFailed, match=rf"{tiny_dirs['target']} <- .* needs 3 GPUs in one worker .*no live node"):
        too_many.run()
    assert time.monotonic() - started < 10 and not list((tmp_path / "three").rglob("*.parquet"))


def test_worker_decodes_on_each_configs_engine_with_identical_outputs(tiny_dirs):
    from actors.target_worker import TargetWorker

    pair = Pair(tiny_dirs["target"], tiny_dirs["draft"])
    group = ModelGroup(pair.target, pair.dtype, (pair.draft,))
    worker = TargetWorker(group)
    sample = ToySource().first_turn("toy", 1)[0]
    configs = [RunConfig(pair, DecodeConfig(methods, gamma=None if methods == "AR" else 3, max_new_tokens=8), engine=engine)
               for methods in ("AR", "MT") for engine in ("eager", "static")]
    for mode in ("live", "replay"):  # replay: one trace collection per engine, AR rows included
        shard = Shard("r", group, "toy", "first", mode, tuple((c, sample.sample_id) for c in configs),
                      ((sample.sample_id, sample.prompt_hash),))
        rows = worker.run_shard(shard, {sample.sample_id: sample}).to_pylist()
        assert [r["engine"] for r in rows] == ["eager", "static"] * 2 and all(r["error"] is None for r in rows)
        for ar_or_sd in (rows[:2], rows[2:]):
            eager, static = ar_or_sd
            assert eager["output_ids"] == static["output_ids"] and eager["accepted_per_block"] == static["accepted_per_block"]
            assert eager["key"] != static["key"]
        # live greedy SD rows carry replay's accepted counts for the same sample (replay fidelity)
        shadows = [r["replay_accepted_per_block"] for r in rows]
        if mode == "live":
            assert shadows[:2] == [None, None] and shadows[2:] == [r["accepted_per_block"] for r in rows[2:]]
        else:
            assert shadows == [None] * 4


def test_one_worker_serves_every_draft_of_its_target_from_one_target_decode(tiny_dirs, monkeypatch):
    import actors.target_worker as worker_module
    import pipeline.decoding.traces as replay_module
    import pipeline.execution.shard_records as records_module

    target, draft = tiny_dirs["target"], tiny_dirs["draft"]
    group = ModelGroup(target, "fp32", (draft, target))  # the target drafting for itself: a second draft
    alone = worker_module.TargetWorker(ModelGroup(target, "fp32", (draft,)))
    worker = worker_module.TargetWorker(group)
    sample = ToySource().first_turn("toy", 1)[0]
    configs = [RunConfig(pair, DecodeConfig(m, gamma=None if m == "AR" else 3, max_new_tokens=8))
               for pair in group.pairs for m in ("AR", "M", "MT")]
    decodes = []
    for module in (replay_module, records_module):  # the traces' decode of y and the live AR decode
        real = module.autoregressive_decode
        monkeypatch.setattr(module, "autoregressive_decode", lambda *a, real=real, **k: decodes.append(1) or real(*a, **k))
    for mode in ("replay", "live"):
        items = tuple((c, sample.sample_id) for c in configs)
        shard = Shard("r", group, "toy", "first", mode, items, ((sample.sample_id, sample.prompt_hash),))
        decodes.clear()
        rows = worker.run_shard(shard, {sample.sample_id: sample}).to_pylist()
        assert len(decodes) == 1  # one target decode for both drafts: both AR rows, and y of every trace
        assert all(r["error"] is None for r in rows) and [r["draft"] for r in rows] == [draft] * 3 + [target] * 3
        assert rows[0]["output_ids"] == rows[3]["output_ids"] and rows[0]["mode"] == "ar"
        # the first draft's rows are what a worker holding that pair alone gives
        single = Shard("r", alone.group, "toy", "first", mode, items[:3], shard.prompt_hashes)
        by_itself = alone.run_shard(single, {sample.sample_id: sample}).to_pylist()
        for shared, own in zip(rows[:3], by_itself):
            assert (shared["output_ids"], shared["accepted_per_block"]) == (own["output_ids"], own["accepted_per_block"])
        if mode == "live":  # the replay check reuses the live AR decode as y
            assert all(r["replay_accepted_per_block"] == r["accepted_per_block"] for r in rows if r["mode"] == "live")
    with pytest.raises(ValueError, match="this worker holds"):
        alone.run_shard(shard, {sample.sample_id: sample})


def test_a_timed_samples_decodes_are_repeated_and_the_fastest_kept(tiny_dirs, monkeypatch):
    import actors.target_worker as worker_module
    from pipeline.decoding.records import SampleRecord

    group = ModelGroup(tiny_dirs["target"], "fp32", (tiny_dirs["draft"],))
    worker = worker_module.TargetWorker(group)
    timed, other = ToySource().first_turn("toy", 2)
    configs = [RunConfig(group.pairs[0], DecodeConfig(m, gamma=None if m == "AR" else 3, max_new_tokens=8)) for m in ("AR", "M")]
    items = tuple((c, s.sample_id) for s in (timed, other) for c in configs)
    shard = Shard("r", group, "toy", "first", "live", items, tuple((s.sample_id, s.prompt_hash) for s in (timed, other)),
                  (timed.sample_id,))
    # the timed sample in two rounds over its configurations (AR first), the other sample once
    seconds, decoded = iter([3.0, 1.0, 5.0, 2.0, 4.0, 6.0]), []
    real = worker.records._decode_once

    def clocked(config, sample):
        record = real(config, sample)
        warm_up = config.decode.max_new_tokens == WARM_UP_TOKENS
        record.time_total_s = None if warm_up else next(seconds)
        decoded.append(("warm-up " * warm_up + config.decode.methods, sample.sample_id == timed.sample_id))
        return record

    monkeypatch.setattr(worker.records, "_decode_once", clocked)
    samples = {s.sample_id: s for s in (timed, other)}
    rows = worker.run_shard(shard, samples).to_pylist()
    # the process's first timed decodes follow one short untimed run of each; then rounds, not runs in a row
    assert decoded == [("warm-up AR", True), ("warm-up M", True)] + [("AR", True), ("M", True)] * 2 + [
        ("AR", False), ("M", False)]
    assert [r["time_total_s"] for r in rows] == [3.0, 1.0, 4.0, 6.0]
    assert [r["timed"] for r in rows] == [True, True, False, False] and all(r["error"] is None for r in rows)
    worker.records.timed_repeats, seconds, decoded = 1, iter([3.0, 5.0, 4.0, 6.0]), []  # `timed_repeats: 1`
    rows = worker.run_shard(shard, samples).to_pylist()
    assert [r["time_total_s"] for r in rows] == [3.0, 5.0, 4.0, 6.0]  # each decoded once: 4 clock readings
    assert not [d for d in decoded if d[0].startswith("warm-up")]  # once a process
    worker.records.timed_repeats, outputs = 2, iter([[1], [1], [1], [2], [1], [1]])  # M's second run differs
    monkeypatch.setattr(worker.records, "_decode_once",
                        lambda config, sample: SampleRecord(sample_id=sample.sample_id, output_ids=next(outputs)))
    rows = worker.run_shard(shard, samples).to_pylist()
    assert "2 decodes of one timed sample gave different outputs" in rows[1]["error"]
    assert [r["error"] is None for r in rows] == [True, False, True, True]


def test_live_rows_record_the_machines_load_around_their_decodes(tiny_dirs, monkeypatch):
    """Before the first and after the last of a timed sample's decodes; replay rows record none."""
    import actors.target_worker as worker_module
    import pipeline.execution.shard_records as records_module

    group = ModelGroup(tiny_dirs["target"], "fp32", (tiny_dirs["draft"],))
    worker = worker_module.TargetWorker(group)
    timed, = ToySource().first_turn("toy", 1)
    configs = [RunConfig(group.pairs[0], DecodeConfig(m, gamma=None if m == "AR" else 3, max_new_tokens=8)) for m in ("AR", "M")]
    shard = Shard("r", group, "toy", "first", "live", tuple((c, timed.sample_id) for c in configs),
                  ((timed.sample_id, timed.prompt_hash),), (timed.sample_id,))
    loads = iter([0.5, 1.5, 2.5, 3.5])
    monkeypatch.setattr(records_module, "machine_load", lambda: next(loads))
    rows = worker.run_shard(shard, {timed.sample_id: timed}).to_pylist()
    # rounds over AR and M: before AR's first run, before M's, after AR's last, after M's
    assert [(r["mode"], r["load_before"], r["load_after"]) for r in rows] == [("ar", 0.5, 2.5), ("live", 1.5, 3.5)]
    assert all(r["cpu_cores"] >= 1 for r in rows)
    replayed = worker.run_shard(replace(shard, mode="replay"), {timed.sample_id: timed}).to_pylist()
    assert [r["load_before"] for r in replayed if r["mode"] == "replay"] == [None]


def embedded_spec(tiny_dirs, limit):
    return parse_grid({
        "name": "qa", "datasets": ["embedded_vqa"], "turns": ["first", "qaorg"],
        "pairs": [{"target": tiny_dirs["target"], "draft": tiny_dirs["draft"]}],
        "methods": ["AR", "M"], "gamma": [3], "max_new_tokens": 8, "limit": limit, "shard_size": 2,
    })


def test_a_resume_recomputes_rows_whose_prompt_changed(ray_local, tiny_dirs, tmp_path):
    """qaorg's last second turn wraps to the first sample: a larger limit changes its prompt."""
    def go(out, limit):
        stream = io.StringIO()
        report = GridRunner(embedded_spec(tiny_dirs, limit), out, workers=1, stream=stream).run()
        return report, stream.getvalue()

    go(tmp_path / "resumed", 2)
    report, log = go(tmp_path / "resumed", 3)
    assert report.rows_recomputed == 2 and "2 rows are computed again: made from another prompt" in log
    go(tmp_path / "fresh", 3)
    resumed, fresh = results(tmp_path / "resumed"), results(tmp_path / "fresh")
    assert resumed.key.is_unique and len(resumed) == len(fresh) == 2 * 2 * 3
    pd.testing.assert_frame_equal(comparable(resumed), comparable(fresh))


class RepairedSource(ToySource):
    """ToySource with the broken sample's image put back."""

    def first_turn(self, dataset, limit):
        samples = super().first_turn(dataset, limit)
        samples[4] = dataclasses.replace(samples[4], images=(Image.new("RGB", (60, 50), (90, 90, 90)),))
        return samples


def test_a_rerun_retries_resource_errors_and_inputs_that_were_fixed(ray_local, tiny_dirs, full_run, tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(full_run[0], tmp_path, dirs_exist_ok=True)
    path = next(p for p in sorted(tmp_path.rglob("part-*.parquet")) if 4 not in pq.read_table(p)["row"].to_pylist())
    table = pq.read_table(path)  # pretend its first row ran out of device memory
    oom = table["key"][0].as_py()
    for column, value in (("error", "OutOfMemoryError: CUDA out of memory"), ("error_category", "resource")):
        values = table[column].to_pylist()
        values[0] = value
        table = table.set_column(table.schema.get_field_index(column), column, pa.array(values, pa.string()))
    pq.write_table(table, path)
    stream = io.StringIO()
    report = GridRunner(spec(tiny_dirs), tmp_path, source=RepairedSource(), workers=1, stream=stream).run()
    df = results(tmp_path)
    broken = df[df["row"] == 4]
    assert df.key.is_unique and len(df) == len(results(full_run[0]))
    assert broken.error.isna().all() and len(broken) == len(spec(tiny_dirs).units())  # the fixed sample, both turns
    assert pd.isna(df.set_index("key").loc[oom, "error"])  # the resource error was retried
    assert report.rows_recomputed == len(broken) + 1 and "retrying resource errors" in stream.getvalue()


def test_a_second_driver_on_the_same_run_is_refused(ray_local, tiny_dirs, tmp_path):
    import json
    import socket
    import subprocess
    import sys

    from pipeline.storage.run_lock import RunLocked
    from pipeline.storage.store import run_dir

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # the first driver
    lock = run_dir(tmp_path, "toy") / ".lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": other.pid, "since": "earlier"}))
    try:
        with pytest.raises(RunLocked, match=f"being written by pid {other.pid}"):
            run(tiny_dirs, tmp_path)
    finally:
        other.kill()
        other.wait()
    assert not list(tmp_path.rglob("*.parquet"))


def test_timed_shards_run_first_on_cpu_workers_that_hold_the_whole_node(ray_local, tiny_dirs, tmp_path):
    """Walltime is never measured beside another decode: with CPU workers (no GPU each), the
    shards holding timed samples are dispatched before every other shard of their phase, to
    workers that take all of the node's CPUs (2 here) as threads."""
    import pyarrow.parquet as pq
    import ray

    written = []

    def record(path, runner):
        row = pq.read_table(path, columns=["turn", "timed"]).slice(0, 1).to_pylist()[0]
        written.append((row["turn"], row["timed"], [ray.get(w.handle.device_name.remote()) for w in runner.workers]))

    grid = dataclasses.replace(spec(tiny_dirs, "auto"), live_samples=2)
    runner = GridRunner(grid, tmp_path, source=ToySource(), gpus_per_worker=0, stream=io.StringIO(),
                        on_shard_written=record)
    runner.run()
    flags = [timed for turn, timed, _ in written if turn == "first"]
    assert True in flags and flags == sorted(flags, reverse=True)  # every timed shard before the others of its phase
    assert all(devices == ["cpu (threads: 2)"] for _, timed, devices in written if timed)
    assert all(devices == ["cpu (threads: 1)"] * 2 for _, timed, devices in written if not timed)
    df = results(tmp_path)
    assert set(df["mode"][df.timed]) == {"live", "ar"} and df.error[df.timed].isna().any()


class KillsItsWorker(str):
    """A sample's reference answer standing in for a sample that crashes the process decoding it
    (an OOM kill, a segfault in a kernel): unpickling it in the worker ends that process at once."""

    def __reduce__(self):
        return os._exit, (1,)


class PoisonSource(ToySource):
    def first_turn(self, dataset, limit):
        samples = super().first_turn(dataset, limit)
        return [replace(s, answer=KillsItsWorker("a dog")) if s.row == 1 else s for s in samples]


def test_a_sample_that_kills_its_worker_becomes_failed_rows(ray_local, tiny_dirs, full_run, tmp_path):
    grid = replace(spec(tiny_dirs), turns=("first",))
    runner = GridRunner(grid, tmp_path, source=PoisonSource(), workers=1, stream=io.StringIO())
    report = runner.run()  # was: the shard failed 3 times (9 worker deaths) and the run ended
    rows = results(tmp_path)
    poisoned = rows[rows["sample_id"] == "toy/test/1/first"]
    assert len(poisoned) and poisoned["error"].str.contains("worker process died").all()
    assert (poisoned["error_category"] == "model").all() and report.redispatched >= 1
    healthy = rows[rows["sample_id"] != "toy/test/1/first"]
    reference = results(full_run[0])
    reference = reference[(reference["turn"] == "first") & (reference["sample_id"] != "toy/test/1/first")]
    pd.testing.assert_frame_equal(comparable(healthy).reset_index(drop=True),
                                  comparable(reference).reset_index(drop=True))  # nothing lost or doubled
