"""Grid files: validation names the bad entry, expansion normalises and dedupes, keys are stable,
shard planning bundles replay configs and skips finished rows. No Ray, no model loads."""
from __future__ import annotations

from dataclasses import replace

import copy
import re

import pytest
import yaml

from pipeline.data.sample import Sample
from pipeline.planning.grid import ENGINE_CHOICES, Catalog, GridError, RunConfig, row_key
from pipeline.planning.grid_file import load_grid, parse_grid
from pipeline.planning.shards import plan_shards, unit_counts
from pipeline.planning.timed_samples import choose_timed

CATALOG = Catalog(datasets=("toy", "other"), turn_tasks=("again",))
BASE = {
    "name": "t",
    "datasets": ["toy"],
    "turns": ["first", "again"],
    "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}],
    "methods": ["AR", "M", "MT"],
    "policies": ["static", {"kind": "grid", "measure": "hard+soft"}, {"kind": "inverse", "temperature": 0.5}],
    "window": [None, 4],
    "distance": ["kl", "tvd"],
    "gamma": [3, 5],
    "max_new_tokens": 16,
    "shard_size": 2,
}


def grid(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return parse_grid(raw, CATALOG)


def test_expansion_normalises_fields_that_cannot_change_a_result():
    configs = grid().configs()
    by_methods = {m: [c for c in configs if c.decode.methods == m] for m in ("AR", "M", "MT")}
    # AR ignores gamma/policy/window/distance; M (one method) ignores policy/window/distance
    assert len(by_methods["AR"]) == 1 and by_methods["AR"][0].decode.gamma is None
    assert len(by_methods["M"]) == 2 and {c.decode.gamma for c in by_methods["M"]} == {3, 5}
    assert all(c.decode.policy.kind == "static" for c in by_methods["M"])
    # MT: static (1) + grid hard+soft ignores distance (2 windows) + inverse (2 windows x 2 distances), per gamma
    assert len(by_methods["MT"]) == 2 * (1 + 2 + 4)
    assert len(set(configs)) == len(configs)
    assert len(grid().units()) == len(configs) * 2  # x turns x datasets


def test_keys_are_stable_and_cover_result_fields_only():
    first, again = grid().configs(), grid(mode="replay").configs()
    assert [c.key() for c in first] == [c.key() for c in again]  # the decoding mode is not a result field
    assert len({c.key() for c in first}) == len(first)
    config = first[1]
    assert replace(config, decode=replace(config.decode, seed=1)).key() != config.key()
    assert row_key(config.key(), "toy/test/0/first", "h") != row_key(config.key(), "toy/test/1/first", "h")
    assert row_key(config.key(), "toy/test/0/first", "h") == row_key(config.key(), "toy/test/0/first", "h")
    assert row_key(config.key(), "toy/test/0/first", "h") != row_key(config.key(), "toy/test/0/first", "other prompt")


def test_engine_is_an_axis_that_every_config_keeps():
    assert {c.engine for c in grid().configs()} == {"auto"}  # the default: the core picks by device
    eager = grid(engine="eager").configs()
    assert {c.engine for c in eager} == {"eager"} and len(eager) == len(grid().configs())
    both = grid(engine=["static", "eager"]).configs()
    assert len(both) == 2 * len(eager) and len(set(both)) == len(both)
    ar = [c for c in both if c.decode.is_ar]
    assert sorted(c.engine for c in ar) == ["eager", "static"]  # the AR baseline's walltime depends on it
    assert [c.decode_engine for c in grid(engine=["auto", "static"]).configs()[:2]] == [None, "static"]
    from pipeline.planning.shards import counts

    assert counts(grid(engine=["static", "eager"]))["engine"] == {"static": len(eager) * 2, "eager": len(eager) * 2}


def test_key_differs_by_engine_setting():
    config = grid().configs()[1]
    keys = {RunConfig(**{**config.__dict__, "engine": engine}).key() for engine in ENGINE_CHOICES}
    assert len(keys) == len(ENGINE_CHOICES)


def test_grid_engine_choices_are_the_cores_engines():
    from pipeline.decoding.engine import ENGINES

    assert ENGINE_CHOICES == ("auto", *ENGINES)


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"datasets": ["toy", "nope"]}, "datasets[1]"),
        ({"turns": ["first", "later"]}, "turns[1]"),
        ({"methods": ["M", "MX"]}, "methods[1]"),
        ({"methods": ["MM"]}, "methods[0]"),
        ({"policies": ["static", "best"]}, "policies[1]"),
        ({"policies": [{"kind": "grid", "measure": "vibes"}]}, "policies[0]"),
        ({"policies": [{"kind": "static", "temperature": 2}]}, "policies[0]"),
        ({"pairs": [{"target": "tiny:target", "draft": "not a model"}]}, "pairs[0].draft"),
        ({"pairs": [{"target": "/no/such/dir", "draft": "tiny:draft"}]}, "pairs[0].target"),
        ({"pairs": [{"target": "embedded:huge", "draft": "tiny:draft"}]}, "pairs[0].target"),
        ({"pairs": [{"target": "tiny:target", "draft": "tiny:draft", "dtype": "fp8"}]}, "pairs[0].dtype"),
        ({"window": [None, 0]}, "window[1]"),
        ({"distance": ["kl", "l2"]}, "distance[1]"),
        ({"gamma": [0]}, "gamma[0]"),
        ({"temperature": [-1]}, "temperature[0]"),
        ({"methods": ["MTC"]}, "methods[0] 'MTC' uses caption drafting (C)"),
        ({"methods": ["M", "MP"], "pairs": [{"target": "tiny:next_target", "draft": "tiny:next_target"}]},
         "methods[1] 'MP' with pairs[0].draft"),
        ({"turns": ["again"]}, "add 'first' to turns"),
        ({"temperature": [0.7]}, "add 0 to temperature"),
        ({"mode": "replay", "temperature": [0, 0.7]}, "mode 'replay'"),
        ({"colour": "blue"}, "unknown grid field(s) ['colour']"),
        ({"sources": {"toy": "/no/such/copy"}}, "sources.toy"),
        ({"sources": {"other": "."}}, "sources.other: not a dataset or question task"),
        ({"sources": ["toy"]}, "grid field 'sources'"),
        ({"live_samples": 2}, "live_samples: 2 only applies to mode 'auto'"),
        ({"engine": ["static", "fast"]}, "engine[1]: unknown engine 'fast'; choose one of auto, static, eager"),
        ({"engine": []}, "grid field 'engine' is an empty list"),
        ({"temperature": [0.0, float("nan")]}, "temperature[1]: expected a finite number"),
        ({"temperature": [0.0, float("inf")]}, "temperature[1]: expected a finite number"),
        ({"policies": [{"kind": "inverse", "temperature": float("nan")}]}, "policies[0]: inverse-error temperature"),
        ({"datasets": ["toy", "other", "toy"]}, "datasets[2]: 'toy' is already listed as datasets[0]"),
        ({"methods": ["M", "MT", "M"]}, "methods[2]: 'M' is already listed"),
        ({"gamma": [3, 3]}, "gamma[1]: 3 is already listed"),
        ({"pairs": [{"target": "tiny:target", "draft": "tiny:draft"}] * 2}, "pairs[1]: 'tiny:target <- tiny:draft (fp32)' is already listed"),
    ],
)
def test_invalid_entries_are_named(changes, named):
    with pytest.raises(GridError) as err:
        grid(**changes)
    assert named in str(err.value)


def test_pooled_drafting_rejected_for_a_local_llava_next_draft(tiny_dirs):
    with pytest.raises(GridError, match=r"methods\[0\] 'MP' with pairs\[0\].draft"):
        grid(methods=["MP"], pairs=[{"target": tiny_dirs["target"], "draft": tiny_dirs["next_target"]}])
    assert grid(methods=["MP"], pairs=[{"target": tiny_dirs["target"], "draft": tiny_dirs["draft"]}]).configs()


def test_model_directories_are_checked_on_disk(tiny_dirs, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(GridError, match=r"pairs\[0\].target: directory .* is not a model \(it has no config.json\)"):
        grid(pairs=[{"target": str(tmp_path / "empty"), "draft": tiny_dirs["draft"]}])
    from pipeline.models.tiny import build_llava, build_tokenizer, llava_processor

    other = build_tokenizer(vocab_size=320)
    build_llava(other).save_pretrained(tmp_path / "other")
    llava_processor(other).save_pretrained(tmp_path / "other")
    with pytest.raises(GridError, match=r"pairs\[0\]: target .* and draft .* have different tokenizers"):
        grid(pairs=[{"target": tiny_dirs["target"], "draft": str(tmp_path / "other")}])
    assert grid(pairs=[{"target": tiny_dirs["target"], "draft": tiny_dirs["draft"]}]).pairs


def test_repo_grids_validate():
    catalog = Catalog.from_registry()
    for name in ("smoke", "embedded", "paper_full"):
        spec = load_grid(f"configs/{name}.yaml", catalog)
        assert spec.name == name and spec.units()


def sample(i: int, turn: str = "first") -> Sample:
    return Sample("toy", "test", i, turn, "USER: hi ASSISTANT:")


def walltime(samples: list[Sample], count: int = 1) -> set[str]:
    """The run's walltime samples among `samples` (one dataset), as `RunSamples.timed_ids` deals them."""
    return set(choose_timed({samples[0].dataset: samples}, count, seed=0))


def test_plan_shards_bundles_replay_configs_and_skips_done_rows():
    spec = grid(methods=["AR", "M", "MT"], gamma=[5], window=[None], distance=["kl"], turns=["first"])
    units = spec.units()
    samples = [sample(i) for i in range(5)]
    live = plan_shards("r", units, lambda u: samples, shard_size=2)
    n_configs = len(spec.configs())
    # greedy configs ride together in live shards too (one shadow replay checks them): ceil(5 / 2) shards
    assert [s.mode for s in live] == ["live"] * 3 and all(len({c for c, _ in s.items}) == n_configs for s in live)
    assert sum(len(s.items) for s in live) == n_configs * 5
    sampled = plan_shards("r", grid(methods=["M", "T"], gamma=[5], temperature=[0.0, 1.0], turns=["first"]).units(),
                          lambda u: samples, shard_size=5)
    assert sorted(len({c for c, _ in s.items}) for s in sampled) == [1, 1, 2]  # one sampling config per shard
    replayed = plan_shards("r", units, lambda u: samples, shard_size=2, grid_mode="auto")
    assert [s.mode for s in replayed] == ["replay"] * 3  # every greedy config of a sample together, AR too
    assert all(len({c for c, _ in s.items}) == n_configs for s in replayed)
    # live_samples: chosen samples run live (walltime), the rest replay, each row once; shards name them
    chosen = set(choose_timed({"toy": samples}, 2, seed=7))
    timed = plan_shards("r", units, lambda u: samples, shard_size=2, grid_mode="auto", timed=chosen)
    keys = [k for s in timed for k in s.keys]
    assert len(keys) == len(set(keys)) == n_configs * 5
    live_sd = [s for s in timed if s.mode == "live" and any(c.decode.methods != "AR" for c, _ in s.items)]
    assert {sid for s in live_sd for _, sid in s.items} == chosen == {sid for s in timed for sid in s.timed}
    # with several datasets the pair's live samples are dealt round-robin over them
    two = grid(datasets=["toy", "other"], methods=["AR", "M"], turns=["first"]).units()
    ids = lambda u: [Sample(u.dataset, "test", i, "first", "USER: hi ASSISTANT:") for i in range(4)]
    walltime = set(choose_timed({u.dataset: ids(u) for u in two}, 3, seed=0))
    dealt = plan_shards("r", two, ids, shard_size=2, grid_mode="auto", timed=walltime)
    live_ids = {sid for s in dealt if s.mode == "live" for _, sid in s.items}
    assert len(live_ids) == 3 and sum(sid.startswith("toy/") for sid in live_ids) == 2
    # second turns are planned on their own and never run live for walltime
    again = grid(datasets=["toy", "other"], methods=["AR", "M"]).units(["again"])
    second = plan_shards("r", again, ids, shard_size=2, grid_mode="auto", timed=walltime)
    assert {s.mode for s in second} == {"replay"}
    # finished rows are not planned again, and a shard planned twice has the same id
    done = set(live[0].keys) | {live[1].keys[0]}
    again = plan_shards("r", units, lambda u: samples, shard_size=2, done=done)
    assert live[0].shard_id not in {s.shard_id for s in again}
    assert sum(len(s.items) for s in again) == n_configs * 5 - len(done)
    assert {s.shard_id for s in again} - {s.shard_id for s in live} == {again[0].shard_id}


def test_drafts_of_one_target_share_shards_and_timed_samples_run_live_with_their_ar_row():
    pairs = [{"target": "tiny:target", "draft": "tiny:draft"}, {"target": "tiny:target", "draft": "tiny:next_target"},
             {"target": "tiny:next_target", "draft": "tiny:draft"}]
    spec = grid(pairs=pairs, methods=["AR", "M"], gamma=[5], window=[None], distance=["kl"], turns=["first"])
    samples = [sample(i) for i in range(3)]
    shards = plan_shards("r", spec.units(), lambda u: samples, shard_size=3, grid_mode="auto", timed=walltime(samples))
    groups = {s.group for s in shards}
    assert {(g.target, g.drafts) for g in groups} == {
        ("tiny:target", ("tiny:draft", "tiny:next_target")), ("tiny:next_target", ("tiny:draft",))}
    for shard in shards:  # every pair of the group in one shard: one target decode per sample serves them all
        assert {c.pair for c, _ in shard.items} == set(shard.group.pairs)
        if shard.mode == "live":  # the walltime sample's AR row is decoded live beside its SD rows
            assert {c.decode.methods for c, _ in shard.items} == {"AR", "M"} and set(shard.timed) == {sid for _, sid in shard.items}
        else:
            assert not shard.timed
    keys = [k for s in shards for k in s.keys]
    assert len(keys) == len(set(keys)) == len(spec.configs()) * 3


def test_a_pair_marked_untimed_is_replayed_on_the_timed_samples_too():
    pairs = [{"target": "tiny:target", "draft": "tiny:draft"},
             {"target": "tiny:target", "draft": "tiny:next_target", "timed": False}]
    spec = grid(pairs=pairs, methods=["AR", "M"], gamma=[5], window=[None], distance=["kl"], turns=["first"])
    timed_pair, untimed_pair = spec.pairs
    assert spec.untimed == (untimed_pair,)
    samples = [sample(i) for i in range(3)]
    shards = plan_shards("r", spec.units(), lambda u: samples, shard_size=3, grid_mode="auto", timed=walltime(samples),
                         untimed=frozenset(spec.untimed))
    live = [s for s in shards if s.mode == "live"]
    assert len(live) == 1 and {c.pair for c, _ in live[0].items} == {timed_pair} and len(live[0].timed) == 1
    chosen = live[0].timed[0]
    replayed = {(c.pair, sid) for s in shards if s.mode == "replay" for c, sid in s.items}
    assert (untimed_pair, chosen) in replayed and (timed_pair, chosen) not in replayed
    assert not any(s.timed for s in shards if s.mode == "replay")  # its rows there are not walltime rows
    keys = [k for s in shards for k in s.keys]
    assert len(keys) == len(set(keys)) == len(spec.configs()) * 3
    with pytest.raises(GridError, match=r"pairs\[0\].timed"):
        grid(pairs=[{"target": "tiny:target", "draft": "tiny:draft", "timed": "sometimes"}])


def test_timed_samples_are_seeded_and_spread_over_distinct_images():
    from PIL import Image

    pictures = [Image.new("RGB", (4, 4), colour) for colour in ("red", "green", "blue")]
    # nine samples, three pictures; the first three rows share one picture
    samples = [Sample("toy", "test", i, "first", "USER: <image> ASSISTANT:", (pictures[i // 3],)) for i in range(9)]
    images = lambda ids: {samples[int(sid.split("/")[2])].pixels()[0].getpixel((0, 0)) for sid in ids}
    for seed in range(5):
        chosen = choose_timed({"toy": samples}, 3, seed)
        assert len(chosen) == 3 and len(images(chosen)) == 3  # never a picture twice while another is left
        assert chosen == choose_timed({"toy": samples}, 3, seed)  # seeded
    assert len({tuple(choose_timed({"toy": samples}, 3, seed)) for seed in range(5)}) > 1
    assert len(choose_timed({"toy": samples}, 20, 0)) == 9  # asking for more takes every sample once
    broken = [Sample("bad", "test", i, "first", "x", error="unreadable") for i in range(3)]
    assert choose_timed({"bad": broken, "toy": samples[:1]}, 2, 0) == ["toy/test/0/first"]  # never a failed sample


def test_dry_run_counts_without_loading_models_or_data(tmp_path, monkeypatch, capsys):
    import jobs.full_grid as full_grid
    import pipeline.data.loading
    import pipeline.models.loading

    def forbidden(*args, **kwargs):
        raise AssertionError("--dry-run must not load models or data")

    monkeypatch.setattr(pipeline.models.loading, "load_model", forbidden)
    monkeypatch.setattr(pipeline.data.loading, "load_samples", forbidden)
    assert full_grid.main(["--grid", "configs/smoke.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    spec = load_grid("configs/smoke.yaml")
    assert f"{len(spec.units())} work units" in out
    assert "embedded_vqa: 46" in out and "MT: 24" in out and "tiny:target <- tiny:draft (fp32): 28" in out
    assert "tiny:bigram_target <- tiny:eagle_head (fp32): 8" in out  # a head: AR and M only
    assert "\n".join(unit_counts(spec)) in out


def test_invalid_grid_fails_before_ray_or_models(tmp_path, monkeypatch, capsys):
    import ray

    import jobs.full_grid as full_grid
    import pipeline.models.loading

    def forbidden(*args, **kwargs):
        raise AssertionError("an invalid grid must fail before Ray starts or a model loads")

    monkeypatch.setattr(ray, "init", forbidden)
    monkeypatch.setattr(pipeline.models.loading, "load_model", forbidden)
    raw = yaml.safe_load(open("configs/smoke.yaml"))
    raw["methods"] = ["M", "MZ"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert full_grid.main(["--grid", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "methods[1] 'MZ'" in err and "unknown drafting method" in err
    assert not (tmp_path / "out").exists()


def test_local_copies_reach_the_data_loaders(tmp_path, monkeypatch):
    """`sources` in a grid is how a cluster without hub access points at its local copies."""
    import pipeline.data
    from pipeline.planning.samples import RegistrySource

    (tmp_path / "toy").mkdir()
    spec = grid(sources={"toy": str(tmp_path / "toy")})
    seen = {}
    monkeypatch.setattr(pipeline.data, "load_samples", lambda name, *, limit, source: seen.setdefault(name, source) and [])
    monkeypatch.setattr(pipeline.data, "build_second_turn", lambda first, outputs, task, *, source: seen.setdefault(task, source) and [])
    source = RegistrySource(dict(spec.sources))
    source.first_turn("toy", None)
    source.second_turn([], {}, "nq")
    assert seen == {"toy": str(tmp_path / "toy"), "nq": None}


def test_second_turns_are_built_once_per_target_from_its_own_answers():
    from pipeline.planning.samples import RunSamples

    class Source:
        def first_turn(self, dataset, limit):
            return [sample(i) for i in range(limit)]

        def second_turn(self, first, outputs, task):
            return [Sample("toy", "test", s.row, task, s.prompt + outputs[s.sample_id]) for s in first]

    reads = []

    def answers(pair, dataset, turn, max_new_tokens):
        reads.append((pair.target, dataset, max_new_tokens))
        assert turn == "first"
        return {sample(i).sample_id: f" [{pair.target}]" for i in range(2)}

    spec = grid(pairs=[{"target": "tiny:target", "draft": "tiny:draft"}, {"target": "tiny:next_target", "draft": "tiny:draft"}], limit=2)
    book = RunSamples(spec, Source(), answers)
    second = [u for u in spec.units(["again"]) if u.config.decode.methods == "M"]
    by_target = {u.config.pair.target: book.for_unit(u) for u in second}
    for u in spec.units(["again"]):
        book.for_unit(u)
    assert sorted(reads) == [("tiny:next_target", "toy", 16), ("tiny:target", "toy", 16)]  # once per target, not per unit
    assert by_target["tiny:target"][0].prompt.endswith("[tiny:target]") and by_target["tiny:next_target"][0].prompt.endswith("[tiny:next_target]")
    pair_b = second[-1].config.pair
    assert book.get(pair_b, by_target["tiny:next_target"][1].sample_id).prompt.endswith("[tiny:next_target]")


def test_a_policy_can_name_the_ensembles_it_runs_on():
    # the paper's eight configurations: MT* = MT with the grid, MTCP* = MTCP with inverse weights
    spec = grid(
        methods=["AR", "M", "T", "MT", "MTCP"], captioner="embedded", window=[None], distance=["kl"], gamma=[5],
        policies=["static", {"kind": "grid", "methods": ["MT"]}, {"kind": "inverse", "methods": "MTCP"}],
    )
    labels = sorted((c.decode.method_label, c.decode.policy.kind) for c in spec.configs())
    assert labels == [("AR", "static"), ("M", "static"), ("MT", "static"), ("MT*", "grid"),
                      ("MTCP", "static"), ("MTCP*", "inverse"), ("T", "static")]


@pytest.mark.parametrize("policies, message", [
    (["static", {"kind": "grid", "methods": ["MP"]}], "policies[1].methods: 'MP' is not an ensemble of this grid's methods"),
    (["static", {"kind": "grid", "methods": ["M"]}], "policies[1].methods: 'M' is not an ensemble"),
    ([{"kind": "grid", "methods": ["MT"]}], "methods[3] 'MTCP': no policy runs on it"),
])
def test_policy_method_restrictions_are_validated(policies, message):
    with pytest.raises(GridError, match=re.escape(message)):
        grid(methods=["AR", "M", "MT", "MTCP"], captioner="embedded", policies=policies)


def test_a_pair_marked_timed_only_decodes_the_timed_samples_alone():
    """A head's rows all run live: `timed: only` keeps it to the walltime samples, every other
    pair's rows untouched; it needs the samples it names."""
    pairs = [{"target": "tiny:target", "draft": "tiny:draft"},
             {"target": "tiny:target", "draft": "tiny:next_target", "timed": "only"}]
    spec = grid(pairs=pairs, methods=["AR", "M"], gamma=[5], window=[None], distance=["kl"], turns=["first"],
                mode="auto", live_samples=1)
    full_pair, only_pair = spec.pairs
    assert spec.timed_only == (only_pair,) and spec.untimed == ()
    samples = [sample(i) for i in range(3)]
    shards = plan_shards("r", spec.units(), lambda u: samples, shard_size=3, grid_mode="auto", timed=walltime(samples),
                         timed_only=frozenset(spec.timed_only))
    rows = [(c.pair, sid, s.mode) for s in shards for c, sid in s.items]
    chosen = {sid for s in shards for sid in s.timed}
    assert len(chosen) == 1
    assert {(sid, mode) for pair, sid, mode in rows if pair == only_pair} == {(*chosen, "live")}
    assert {sid for pair, sid, _ in rows if pair == full_pair} == {s.sample_id for s in samples}
    with pytest.raises(GridError, match="timed: only.*live_samples"):
        grid(pairs=pairs, methods=["AR", "M"])
    # the run's samples and its manifest expect the same rows: the timed ones alone, first turns only
    from pipeline.planning.samples import RunSamples

    class Source:
        def first_turn(self, dataset, limit):
            return samples

    run = RunSamples(spec, Source(), answers=lambda *_: {})
    units = [u for u in spec.units() if u.config.pair == only_pair]
    assert run.timed_ids() == chosen
    assert {s.sample_id for u in units for s in run.for_unit(u)} == chosen
    assert all(run.count(u) == 1 for u in units)
    full = [u for u in spec.units() if u.config.pair == full_pair]
    assert all(len(run.for_unit(u)) == run.count(u) == 3 for u in full)


def test_a_verify_kind_marked_untimed_is_replayed_on_the_timed_samples_too():
    """`{kind: candidates, timed: false}`: trees scored by replay everywhere, chains timed live."""
    spec = grid(methods=["AR", "MT"], gamma=[5], window=[None], distance=["kl"], turns=["first"], policies=["static"],
                verify=["chain", {"kind": "candidates", "timed": False}])
    assert [v.kind for v in spec.verify] == ["chain", "candidates"] and [v.kind for v in spec.untimed_verify] == ["candidates"]
    samples = [sample(i) for i in range(3)]
    shards = plan_shards("r", spec.units(), lambda u: samples, shard_size=3, grid_mode="auto", timed=walltime(samples),
                         untimed=frozenset(spec.untimed_verify))
    live = {(c.decode.methods, c.decode.verify.kind) for s in shards if s.mode == "live" for c, _ in s.items}
    assert live == {("AR", "chain"), ("MT", "chain")}
    replayed = [(c.decode.verify.kind, sid) for s in shards if s.mode == "replay" for c, sid in s.items if c.decode.methods == "MT"]
    assert sorted(kind for kind, _ in replayed).count("candidates") == 3  # every sample, the timed one included
    keys = [k for s in shards for k in s.keys]
    assert len(keys) == len(set(keys)) == len(spec.configs()) * 3
    with pytest.raises(GridError, match=r"verify\[0\]\.timed: expected true or false"):
        grid(verify=[{"kind": "candidates", "timed": "no"}])


def test_validation_lists_every_problem_with_the_name_probably_meant():
    with pytest.raises(GridError) as err:
        grid(datasets=["toy", "tyo"], turns=["first", "agian"], methods=["AR", "mt", "MX"], engine=["statc"],
             policies=["static", {"kind": "gird"}], gamma=[0, 5], colur="blue", timed_repeats=0,
             calibrate_rounds=0)
    message = str(err.value)
    expected = [
        "unknown grid field(s) ['colur']",
        "datasets[1]: unknown dataset 'tyo' (did you mean 'toy'?)",
        "turns[1]: unknown turn 'agian' (did you mean 'again'?)",
        "methods[1] 'mt'", "(did you mean 'MT'?)", "methods[2] 'MX'", "(did you mean 'M'?)",
        "engine[0]: unknown engine 'statc'; choose one of auto, static, eager (did you mean 'static'?)",
        "policies[1]: unknown weight policy 'gird' (did you mean 'grid'?)",
        "gamma[0]: expected an integer from 1 to 64, got 0",
        "timed_repeats: expected an integer from 1 to 1,000, got 0",
        "calibrate_rounds: expected an integer from 1 to 1,000, got 0",
    ]
    assert message.startswith("10 problems:"), message
    for part in expected:
        assert part in message, (part, message)


def test_relative_data_paths_are_read_from_the_grid_files_folder(tmp_path, monkeypatch):
    """Not from wherever the job happens to be started; a missing file says where it was looked for."""
    folder = tmp_path / "experiment"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "signs.jsonl").write_text('{"question": "q?", "image": "x.png"}\n')
    (folder / "copies").mkdir()
    entry = {"name": "signs", "path": "data/signs.jsonl"}
    grid_path = folder / "grid.yaml"
    grid_path.write_text(yaml.safe_dump({**BASE, "datasets": ["toy", entry], "turns": ["first"],
                                         "sources": {"toy": "copies"}}))
    monkeypatch.chdir(tmp_path)  # elsewhere
    spec = load_grid(grid_path, CATALOG)
    assert spec.user_datasets[0].path == str(folder / "data" / "signs.jsonl")
    assert dict(spec.sources)["toy"] == str(folder / "copies")
    grid_path.write_text(yaml.safe_dump({**BASE, "datasets": ["toy", {**entry, "path": "data/sings.jsonl"}]}))
    with pytest.raises(GridError) as err:
        load_grid(grid_path, CATALOG)
    assert (f"datasets[1] (signs): data/sings.jsonl does not exist (looked for {folder / 'data' / 'sings.jsonl'}, "
            f"relative to the grid file's folder {folder})") in str(err.value)


def test_a_verify_entry_can_name_the_method_sets_it_runs_on():
    spec = grid(methods=["AR", "M", "MT"], gamma=[5], window=[None], distance=["kl"],
                verify=["chain", {"kind": "candidates", "methods": ["MT"]}, {"kind": "dynamic", "methods": ["M"]}])
    kinds = {(c.decode.methods, c.decode.verify.kind) for c in spec.configs()}
    assert ("MT", "candidates") in kinds and ("M", "dynamic") in kinds and ("MT", "dynamic") not in kinds
    assert ("AR", "chain") in kinds  # AR verifies nothing: never removed
    with pytest.raises(GridError, match=re.escape("verify[1].methods: 'MTC' is not a method set of this grid's")):
        grid(verify=["chain", {"kind": "candidates", "methods": ["MTC"]}])
