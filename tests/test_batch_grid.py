"""The grid's `batch` axis: requests decoded B at a time, AR and SD alike. Batch 1 keeps the keys
rows had before the axis; a bad batch size is refused naming the entry, while every verify
kind, sampling and state-space drafts batch; a batch size's configurations and its AR baseline
are planned live together in whole batches; and through the job, rows record their batch, the
report gives speedup against the batch size and the audit counts how many batched rows equal
the same request decoded alone."""
from __future__ import annotations

import copy
import re

import pandas as pd
import pytest

from pipeline.data.sample import Sample
from pipeline.planning.grid import Catalog, GridError
from pipeline.planning.grid_file import parse_grid
from pipeline.planning.shards import plan_shards
from pipeline.storage.calibration_store import read_calibrations
from tests.conftest import OWN_KIND

CATALOG = Catalog(datasets=("toy",), turn_tasks=())
BASE = {"name": "t", "datasets": ["toy"], "turns": ["first"], "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}],
        "methods": ["AR", "M", "MT"], "policies": ["static", {"kind": "grid", "measure": "hard+soft"}],
        "gamma": [3], "max_new_tokens": 12, "shard_size": 3}


def grid(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return parse_grid(raw, CATALOG)


def test_batch_one_keeps_the_keys_rows_had_before_the_axis():
    before = {c.key() for c in grid().configs()}
    swept = grid(batch=[1, 2, 4]).configs()
    assert {c.key() for c in swept if c.batch == 1} == before
    assert len({c.key() for c in swept}) == len(swept) == 3 * len(before)  # every batch size its own rows
    assert {c.batch for c in swept} == {1, 2, 4}


@pytest.mark.parametrize("changes, named", [
    ({"batch": [0]}, "batch[0]: expected an integer from 1 to 64, got 0"),
    ({"batch": [2, 65]}, "batch[1]: expected an integer from 1 to 64, got 65"),
    ({"batch": ["two"]}, "batch[0]: expected an integer"),
])
def test_a_bad_batch_size_is_refused_naming_the_entry(changes, named):
    with pytest.raises(GridError, match=re.escape(named)):
        grid(**changes)


def test_every_verify_kind_sampling_and_a_state_space_draft_batch():
    kinds = ["chain", "candidates", {"kind": "dynamic"}, {"kind": "shape", "shape": [2, 1]}, {"kind": "bandit"}]
    pairs = [{"target": "tiny:target", "draft": "tiny:draft"}, {"target": "tiny:bigram_target", "draft": "tiny:mamba2_draft"}]
    configs = grid(batch=[2, 3], verify=kinds, temperature=[0.0, 1.0], pairs=pairs, mode="auto").configs()
    sd = [c for c in configs if not c.decode.is_ar]
    assert {c.decode.verify.kind for c in sd} == {"chain", "candidates", "dynamic", "shape", "bandit"}
    assert {(c.batch, c.decode.temperature, c.pair.draft) for c in sd} == {
        (b, t, d) for b in (2, 3) for t in (0.0, 1.0) for d in ("tiny:draft", "tiny:mamba2_draft")}


def test_a_batch_size_is_planned_live_with_its_ar_row_in_whole_batches():
    spec = grid(batch=[1, 2], verify=["chain", "candidates"])
    samples = [Sample("toy", "test", i, "first", "USER: hi ASSISTANT:") for i in range(5)]
    shards = plan_shards("r", spec.units(), lambda u: samples, shard_size=3, grid_mode="auto")
    batched = [s for s in shards if any(c.batch == 2 for c, _ in s.items)]
    assert all(s.mode == "live" and {c.batch for c, _ in s.items} == {2} for s in batched)  # never replayed
    assert all(any(c.decode.is_ar for c, _ in s.items) for s in batched)  # AR at the same batch rides along
    # shards of 4 samples (3 rounded up to whole batches of 2), then the last one
    assert [len({sid for _, sid in s.items}) for s in batched] == [4, 1]
    keys = [k for s in shards for k in s.keys]
    assert len(keys) == len(set(keys)) == len(spec.configs()) * 5
    alone = [s for s in shards if all(c.batch == 1 for c, _ in s.items)]
    assert {s.mode for s in alone} == {"replay"}  # batch 1 replays greedy configurations as before


def test_a_sampled_configuration_at_a_batch_size_is_planned_once():
    """Sampling configurations decode live alone at batch 1 and in their batch size's bundle
    above it: each of their rows is planned (so computed and written) exactly once."""
    spec = grid(batch=[1, 2], temperature=[0.0, 1.0])
    samples = [Sample("toy", "test", i, "first", "USER: hi ASSISTANT:") for i in range(4)]
    shards = plan_shards("r", spec.units(), lambda u: samples, shard_size=4, grid_mode="auto")
    keys = [k for s in shards for k in s.keys]
    assert len(keys) == len(set(keys)) == len(spec.configs()) * 4
    assert any(c.batch == 2 and not c.decode.greedy for s in shards for c, _ in s.items)


@pytest.fixture(scope="module")
def swept(batch_sweep_run):
    return batch_sweep_run


@pytest.mark.slow
def test_the_job_records_each_rows_batch_under_the_keys_a_resume_plans(swept):
    from pipeline.data import load_samples
    from pipeline.storage.store import read_results

    out, _, spec = swept
    rows = read_results(out, "sweep")
    # AR, M, MT* and MT* as a candidate tree and a kind of one's own, at batch 1 and 2, 3 requests
    assert len(rows) == rows["key"].nunique() == 5 * 2 * 3 and rows["error"].isna().all()
    samples = load_samples("embedded_describe", limit=3)
    assert plan_shards("sweep", spec.units(), lambda u: samples, shard_size=2, done=set(rows["key"])) == []
    batched = rows[rows["batch"] > 1]
    assert set(batched["mode"]) == {"live", "ar"}  # a batch is decoded, never replayed
    assert sorted(batched["batch_requests"].value_counts().items()) == [(1, 5), (2, 10)]
    assert (rows["time_request_s"] <= rows["time_wall_s"] + 1e-9).all() and rows["batch_tokens_per_s"].gt(0).all()
    first = rows[(rows["batch"] == 2) & (rows["mode"] == "ar")].sort_values("sample_id")
    assert first["time_request_s"].nunique() > 1  # requests of one batch finish at different times


@pytest.mark.slow
def test_the_report_gives_speedup_against_the_batch_and_where_it_stops_paying(swept):
    out, stdout, _ = swept
    report = out / "_report-sweep"
    table = pd.read_csv(report / "batch.csv")
    assert (report / "batch.png").stat().st_size > 0 and "## Batch sweep" in (report / "summary.md").read_text()
    own = f"MT* ({OWN_KIND}(method=1))"
    assert set(table["batch"]) == {1, 2} and set(table["method_label"]) == {"M", "MT*", "MT* (candidates)", own}
    assert table["speedup"].gt(0).all() and table["expected"].gt(0).all()  # calibrated at every batch size
    [calibration] = read_calibrations(out).all  # measured as the grid asked
    assert (calibration.rounds, calibration.repeats, len(calibration.ratio_draft_target_rounds)) == (2, 3, 2)
    losses = table.groupby("method_label")["stops paying at batch"].first()
    for label, line in table.groupby("method_label"):
        below = line[line["speedup"] < 1]["batch"]
        assert str(losses[label]) == (str(below.min()) if len(below) else "-")
    assert (table["= AR here"] == table["requests"].astype(str) + "/" + table["requests"].astype(str)).all()
    lossless = pd.read_csv(report / "lossless.csv")
    assert (lossless["equal to AR"] == lossless["rows"]).all()  # fp32: exact at every batch
    assert int(lossless["batched rows"].sum()) == 4 * 3  # M, MT*, the tree and the own kind at batch 2
    assert "decoded in batches over 1" in (report / "summary.md").read_text()
    speedup = pd.read_csv(report / "speedup.csv")
    assert len(speedup) == 5  # batch 1 only: a batched row never enters the batch-1 tables
