"""Keys of rows written before the decoding core was laid out by role (and RunConfig came to hold
a DecodeConfig) stay the keys of the same configurations: a run written then resumes with
nothing computed again. `pipeline.planning.grid.key_fields` holds every rule that keeps them."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.decoding.config import AR, DecodeConfig
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.planning.grid import Pair, RunConfig
from pipeline.planning.grid_file import load_grid
from pipeline.planning.verify_entries import make_verify
from pipeline.storage.store import read_results

ROOT = Path(__file__).resolve().parents[1]
# the smoke grid's run at commit 1d62396: its rows (Parquet), calibrations, manifest and grid file
BEFORE = ROOT / "tests" / "fixtures" / "run_before_layout"
PAIR = Pair("llava-hf/llava-1.5-7b-hf", "mjbooo/lvlm68m", "fp16")
# RunConfig.key() of each configuration, printed by the code of commit 1d62396
KEYS_BEFORE = {
    "AR": (DecodeConfig(AR, gamma=None), {}, "941c78728b740e3d"),
    "M chain": (DecodeConfig("M"), {}, "98878616d872f798"),
    "MT* grid chain": (DecodeConfig("MT", GridSearchPolicy(), gamma=3, max_new_tokens=64), {}, "26eae481f03aa85f"),
    "MTCP* inverse, sampled, eager": (DecodeConfig("MTCP", InverseErrorPolicy(), temperature=0.7, seed=2),
                                      {"engine": "eager"}, "c7bcadbeb2a931c3"),
    "MT candidates": (DecodeConfig("MT", GridSearchPolicy(), verify=make_verify("candidates")), {}, "cc88343af387cb48"),
    "MT dynamic": (DecodeConfig("MT", verify=make_verify({"kind": "dynamic", "nodes": 12, "top_k": 3})), {},
                   "253834832ad02456"),
    "MT shape": (DecodeConfig("MT", gamma=3, verify=make_verify({"kind": "shape", "shape": [3, 2, 1]})), {},
                 "d9badde211575fed"),
    "MT bandit": (DecodeConfig("MT", gamma=6, verify=make_verify("bandit")), {}, "288a97231844b96e"),
    "C with a captioner": (DecodeConfig("C"), {"captioner": "tiny:captioner"}, "9431430e8a91612a"),
}


@pytest.mark.parametrize("name", KEYS_BEFORE)
def test_every_kind_of_configuration_keeps_its_key(name):
    decode, run_fields, key = KEYS_BEFORE[name]
    assert RunConfig(PAIR, decode, **run_fields).key() == key


def test_the_smoke_grid_plans_the_keys_its_earlier_run_wrote():
    written = read_results(BEFORE)
    planned = {config.key() for config in load_grid(BEFORE / "smoke.yaml").configs()}
    assert planned == set(written["config_key"])


@pytest.mark.slow
def test_a_run_written_before_resumes_with_nothing_computed_again(tmp_path):
    out = tmp_path / "out"
    shutil.copytree(BEFORE, out, ignore=shutil.ignore_patterns("smoke.yaml"))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "jobs/full_grid.py", "--grid", str(BEFORE / "smoke.yaml"), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "0 rows written" in done.stdout and "336 already present, 0 computed again" in done.stdout, done.stdout


# The embedded grid's rows as the code before one decoder served every batch size wrote them
# (commit 3919a34, `python jobs/full_grid.py` on configs/embedded.yaml): every configuration
# key, and per row key a digest of its output, accepted counts, weights and bandit shapes.
EMBEDDED_ROWS = json.loads((ROOT / "tests" / "fixtures" / "embedded_rows.json").read_text())


def row_digest(output_ids, accepted, weights, shapes) -> str:
    """As the fixture's: sha1 of the JSON of the four lists, 12 hex digits."""
    plain = lambda v: [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
    values = [plain(list(output_ids)), plain(list(accepted)), plain([list(w) for w in weights]), plain(list(shapes))]
    return hashlib.sha1(json.dumps(values).encode()).hexdigest()[:12]


def test_the_embedded_grid_plans_the_configurations_its_earlier_run_wrote():
    """The default left out the large draft since, and gained the head, prompt lookup and their
    ensemble across drafters; with the pair its grid file says to add back, and without those, it
    plans exactly the configurations the earlier run wrote (ML, added to the method sets and to
    MT*'s policy, runs on the ensemble alone)."""
    from pipeline.planning.grid_file import parse_grid
    from pipeline.planning.grid_yaml import read_grid_yaml

    path = ROOT / "configs" / "embedded.yaml"
    large = {"target": "embedded:target", "draft": "embedded:draft", "dtype": "fp32", "timed": False}
    assert 'draft: "embedded:draft", dtype: fp32, timed: false}' in path.read_text()  # says how
    raw = read_grid_yaml(path)
    added = ("embedded:head", "pld", "embedded:small_draft+pld")
    raw = {**raw, "pairs": [pair for pair in raw["pairs"] if pair["draft"] not in added]}
    planned = {config.key() for config in parse_grid(raw).configs()}
    with_large = {config.key() for config in parse_grid({**raw, "pairs": raw["pairs"] + [large]}).configs()}
    assert planned < with_large == set(EMBEDDED_ROWS["configs"])


@pytest.mark.slow
def test_a_sample_of_the_embedded_grid_keeps_its_rows():
    """One first-turn sample (replayed) under every configuration of the small and the
    state-space draft, computed as a worker computes it: the same outputs, accepted counts,
    weights and bandit shapes as before, row for row. The inverse-error policy's weights are
    continuous, and their last bits differ between CPUs (an AVX512 EPYC gives other ones than
    the machine that wrote the run): those rows are compared exactly but for their weights,
    which must agree to 1e-5 (they are stored to 6 decimals)."""
    from dataclasses import replace

    from pipeline.drafting.captioner import load_captioner
    from pipeline.execution.shard_records import ShardRecords
    from pipeline.models.loading import load_target_and_drafts
    from pipeline.planning.samples import RegistrySource
    from pipeline.planning.shards import plan_shards

    spec = load_grid(ROOT / "configs" / "embedded.yaml")
    drafts = ("embedded:small_draft", "embedded:ssm_draft")
    sample = next(s for s in RegistrySource().first_turn("embedded_vqa", spec.limit) if s.row == 1)
    units = [u for u in spec.units(["first"]) if u.dataset == "embedded_vqa" and u.config.pair.draft in drafts]
    [shard] = plan_shards("embedded", units, lambda unit: [sample], shard_size=spec.shard_size, grid_mode="replay")
    shard = replace(shard, items=tuple(item for item in shard.items if item[0].pair.draft in drafts or
                                       item[0].decode.is_ar))
    target, models = load_target_and_drafts("embedded:target", {d: d for d in drafts})
    records = ShardRecords(target, models, load_captioner("embedded", target.device)).of(shard, {sample.sample_id: sample})
    assert len(records) == len(shard.items) == 2 + 2 * 20  # an AR row per pair, 20 configurations per draft
    for key, (config, sample_id) in zip(shard.keys, shard.items):
        r = records[(config, sample_id)]
        where = (config.decode.method_label, config.decode.verify.label, config.pair.draft)
        assert r.error is None
        if key in EMBEDDED_ROWS["continuous_rows"]:  # inverse-error weights: their last bits are the CPU's
            expected = EMBEDDED_ROWS["continuous_rows"][key]
            assert (r.output_ids, r.accepted_per_block, r.shape_per_block) == \
                (expected["output_ids"], expected["accepted_per_block"], expected["shape_per_block"]), where
            weights = [w for block in r.weights_per_block for w in block]
            assert weights == pytest.approx([w for block in expected["weights_per_block"] for w in block], abs=1e-5)
            continue
        assert row_digest(r.output_ids, r.accepted_per_block, r.weights_per_block, r.shape_per_block) == \
            EMBEDDED_ROWS["rows"][key], where
