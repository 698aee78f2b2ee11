"""A researcher's own dataset (a JSONL file with images), drafting method and weight policy
(a module outside the package), named in a grid file: validated before Ray, listed by
`--list`, run on Ray through both turns, replayed exactly like the built-ins."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import solid

ROOT = Path(__file__).resolve().parents[1]
EXTENSIONS = '''
"""A user's drafting method and weight policy, outside the tabed package."""
from dataclasses import dataclass

import torch

from pipeline.drafting.methods import DraftingMethod, splice
from pipeline.drafting.policies import WeightPolicy
from pipeline.drafting.weight_states import WeightState


class Grayscale(DraftingMethod, letter="G"):
    """G: M on grayscale pixels."""

    def embeddings(self, model, ids, images, captions):
        gray = [image.convert("L").convert("RGB") for image in images]
        return splice(model, ids, model.image_features(gray) if gray else [])


@dataclass(frozen=True)
class LastBest(WeightPolicy):
    """All weight on the method closest (KL) to the target over the last verified block."""

    def start_state(self, initial):
        return LastBestState(initial)


class LastBestState(WeightState):
    def __init__(self, initial):
        self.weights = initial

    def choose(self):
        return self.weights

    def update(self, q_methods, p_target):
        kl = (p_target[:, None] * (p_target[:, None].clamp_min(1e-12).log() - q_methods.clamp_min(1e-12).log())).sum(-1)
        best = kl.sum(0).argmin()
        self.weights = torch.nn.functional.one_hot(best, q_methods.shape[1]).to(self.weights.dtype)
'''


def write_user_files(root: Path) -> tuple[Path, Path]:
    """The extensions module (in root/plug) and a JSONL dataset whose image paths are relative to it."""
    (root / "plug").mkdir()
    (root / "plug" / "my_extensions.py").write_text(EXTENSIONS)
    data = root / "data"
    (data / "pics").mkdir(parents=True)
    colours = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}
    for name, rgb in colours.items():
        solid(rgb, size=(64, 64)).save(data / "pics" / f"{name}.png")
    rows = [
        {"q": "What colour is the picture?", "img": ["pics/red.png"], "a": "red"},
        {"q": "Compare <image> with <image>. Which is darker?", "img": ["pics/blue.png", "pics/green.png"], "a": "blue"},
        {"q": "Describe the picture.", "img": ["pics/green.png"], "a": "green"},
    ]
    (data / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root / "plug", data / "mine.jsonl"


def user_grid(dataset: Path, **changes) -> dict:
    grid = {
        "name": "byo",
        "datasets": ["embedded_vqa", {"name": "mine", "path": str(dataset), "question": "q", "images": ["img"], "answer": "a"}],
        "turns": ["first", "qaorg"],
        "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}],
        "drafting_methods": ["my_extensions:Grayscale"],
        "methods": ["AR", "M", "G", "MG"],
        "policies": ["static", {"kind": "my_extensions:LastBest", "methods": ["MG"]}],
        "gamma": [3], "max_new_tokens": 12, "limit": 3, "shard_size": 2, "mode": "auto", "live_samples": 2,
    }
    return grid | changes


def job(args: list[str], plug: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(plug), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "full_grid.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_own_dataset_method_and_policy_run_on_ray_and_replay_like_live(tmp_path):
    plug, dataset = write_user_files(tmp_path)
    grid = tmp_path / "byo.yaml"
    grid.write_text(yaml.safe_dump(user_grid(dataset)))
    listed = job(["--grid", str(grid), "--list", "methods"], plug)
    assert "G  grayscale    G: M on grayscale pixels.  (grid)" in listed.stdout, listed.stderr
    done = job(["--grid", str(grid), "--out", str(tmp_path / "out")], plug)
    assert done.returncode == 0, done.stderr[-3000:]
    from pipeline.storage.store import read_results

    rows = read_results(tmp_path / "out")
    assert rows["error"].isna().all(), rows["error"].dropna().tolist()
    assert rows["key"].is_unique and set(rows["turn"]) == {"first", "qaorg"}
    mine = rows[rows["dataset"] == "mine"]
    assert len(mine) == 2 * 3 * 5  # two turns x three rows x (AR, M, G, MG, MG*)
    first = mine[(mine["turn"] == "first")]
    assert set(first["answer"]) == {"red", "blue", "green"} and mine[mine["turn"] == "qaorg"]["answer"].isna().all()
    assert set(mine["method_label"]) == {"AR", "M", "G", "MG", "MG*"}
    user_policy = rows[rows["policy_kind"] == "my_extensions:LastBest"]
    assert set(user_policy["method_label"]) == {"MG*"}
    live = user_policy[user_policy["mode"] == "live"]
    assert len(live) >= 1  # the timed samples ran live, and replay scored them too
    assert all(list(a) == list(r) for a, r in zip(live["accepted_per_block"], live["replay_accepted_per_block"]))
    weights = [list(map(list, w)) for w in user_policy["weights_per_block"]]
    assert any(any(block in ([1.0, 0.0], [0.0, 1.0]) for block in w[1:]) for w in weights)  # the policy's own weights


def test_own_dataset_is_checked_before_ray_naming_entry_and_row(tmp_path, monkeypatch, capsys):
    import jobs.full_grid as full_grid

    plug, dataset = write_user_files(tmp_path)
    monkeypatch.syspath_prepend(str(plug))
    monkeypatch.setattr("ray.init", lambda *a, **k: pytest.fail("Ray must not start"))

    def refused(**changes) -> str:
        entry = {"name": "mine", "path": str(dataset), "question": "q", "images": ["img"]} | changes
        path = tmp_path / "g.yaml"
        path.write_text(yaml.safe_dump(user_grid(dataset, datasets=[entry])))
        assert full_grid.main(["--grid", str(path), "--out", str(tmp_path / "out")]) == full_grid.EXIT_INVALID
        return capsys.readouterr().err

    assert f"datasets[0] (mine): {tmp_path / 'nope.jsonl'} does not exist" in refused(path=str(tmp_path / "nope.jsonl"))
    assert "datasets[0] 'mine': dataset 'mine'" in (text := refused(question="question")) and "lacks column(s) ['question']" in text
    lines = dataset.read_text().splitlines()
    lines[2] = json.dumps({"q": "Describe.", "img": ["pics/missing.png"]})
    dataset.write_text("\n".join(lines) + "\n")
    assert "datasets[0] 'mine' row 2: column 'img': image file 'pics/missing.png' does not exist" in refused()


def test_broken_import_paths_fail_before_ray_with_a_clear_line(tmp_path, monkeypatch):
    from pipeline.planning.grid import GridError
    from pipeline.planning.grid_file import parse_grid

    plug, dataset = write_user_files(tmp_path)
    monkeypatch.syspath_prepend(str(plug))
    cases = [
        ({"drafting_methods": ["nowhere.at_all:Thing"]}, r"drafting_methods\[0\]: no Python source file for module 'nowhere.at_all'"),
        ({"drafting_methods": ["my_extensions:LastBest"]}, r"'my_extensions:LastBest' is not a DraftingMethod subclass"),
        ({"drafting_methods": ["my_extensions"]}, r"expected an import path 'package.module:Class'"),
        ({"policies": [{"kind": "my_extensions:Grayscale"}]}, r"policies\[0\].kind: 'my_extensions:Grayscale' is not a WeightPolicy"),
        ({"policies": [{"kind": "my_extensions:LastBest", "sharpness": 2}]}, r"\['sharpness'\] not a field"),
        ({"methods": ["MX"]}, r"unknown drafting method letter\(s\) \['X'\].*G \(grayscale\)"),
    ]
    for changes, message in cases:
        with pytest.raises(GridError, match=message):
            parse_grid(user_grid(dataset, **changes))


def test_a_module_without_the_named_class_is_refused_before_any_of_its_code_runs(tmp_path, monkeypatch):
    from pipeline.planning.grid import GridError
    from pipeline.planning.grid_file import parse_grid

    plug, dataset = write_user_files(tmp_path)
    ran = tmp_path / "module code ran"
    (plug / "not_a_plugin.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(plug))
    for changes in ({"drafting_methods": ["not_a_plugin:Method"]}, {"policies": [{"kind": "not_a_plugin:Policy"}]},
                    {"drafting_methods": ["os:system"]}):
        with pytest.raises(GridError, match=r"defines no class|no Python source file"):
            parse_grid(user_grid(dataset, **changes))  # what --dry-run and --list parse
    assert not ran.exists()  # was imported (and its code run) before the class was looked for


def test_dry_run_and_list_read_the_grids_plugins_without_running_them(tmp_path, monkeypatch, capsys):
    """--dry-run and --list plan from the plugins' source: the module's code (here: a marker
    written on import) runs only when the grid runs; what they check and print is the same."""
    import jobs.full_grid as full_grid
    from pipeline.planning.grid import GridError
    from pipeline.planning.grid_file import parse_grid

    plug, dataset = write_user_files(tmp_path)
    ran = tmp_path / "module code ran"
    source = EXTENSIONS.replace('letter="G"', 'letter="K"').replace('"""G:', '"""K:')  # one letter a process
    (plug / "outlined.py").write_text(source + f"\nopen({str(ran)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(plug))
    grid = user_grid(dataset, drafting_methods=["outlined:Grayscale"], methods=["AR", "M", "K", "MK"],
                     policies=["static", {"kind": "outlined:LastBest", "methods": ["MK"]}])
    path = tmp_path / "outlined.yaml"
    path.write_text(yaml.safe_dump(grid))
    assert full_grid.main(["--grid", str(path), "--dry-run"]) == 0
    planned = capsys.readouterr().out
    assert full_grid.main(["--grid", str(path), "--list", "methods"]) == 0
    assert "K  grayscale    K: M on grayscale pixels.  (grid)" in capsys.readouterr().out
    assert full_grid.main(["--grid", str(path), "--list", "policies"]) == 0
    assert "outlined:LastBest        All weight on the method closest (KL)" in capsys.readouterr().out
    refused = [({"policies": [{"kind": "outlined:LastBest", "sharpness": 2}]}, r"sharpness.\] not a field"),
               ({"drafting_methods": ["outlined:LastBest"]}, r"'outlined:LastBest' is not a DraftingMethod"),
               ({"policies": [{"kind": "outlined:Grayscale"}]}, r"'outlined:Grayscale' is not a Weight"),
               ({"methods": ["MX"]}, r"unknown drafting method letter\(s\) \['X'\].*K \(grayscale\)")]
    for changes, message in refused:
        with pytest.raises(GridError, match=message):
            parse_grid(grid | changes, run_plugins=False)
    assert not ran.exists() and "outlined" not in sys.modules
    from pipeline.planning.shards import unit_counts

    assert planned == "\n".join(unit_counts(parse_grid(grid))) + "\n"  # the grid runs: imported now
    assert ran.exists() and "outlined:LastBest: 4" in planned


def test_second_turns_and_multi_image_rows_of_an_own_dataset(tmp_path):
    from pipeline.planning.grid_file import parse_grid
    from pipeline.planning.samples import RegistrySource

    _, dataset = write_user_files(tmp_path)
    spec = parse_grid(user_grid(dataset, drafting_methods=[], methods=["AR", "M"], policies=["static"]))
    source = RegistrySource.for_grid(spec)
    first = source.first_turn("mine", None)
    assert [len(s.images) for s in first] == [1, 2, 1] and all(s.error is None for s in first)
    assert first[1].prompt == "USER: Compare <image> with <image>. Which is darker? ASSISTANT:"
    assert first[0].prompt == "USER: <image>\nWhat colour is the picture? ASSISTANT:" and first[0].category == "benchmark"
    second = source.second_turn(first, {s.sample_id: "It is red." for s in first}, "qaorg")
    assert second[0].images == first[0].images + first[1].images and second[0].prompt.count("<image>") == 3
    assert second[2].prompt.startswith(first[2].prompt + " It is red. USER:")


def test_list_prints_builtins_and_the_grids_own(tmp_path, monkeypatch, capsys):
    import jobs.full_grid as full_grid

    plug, dataset = write_user_files(tmp_path)
    monkeypatch.syspath_prepend(str(plug))
    grid = tmp_path / "byo.yaml"
    grid.write_text(yaml.safe_dump(user_grid(dataset)))
    expected = {
        "datasets": ["embedded_vqa       benchmark easyVQA-QA: ships with the project", "mine               benchmark (grid)"],
        "methods": ["M  multimodal", "G  grayscale    G: M on grayscale pixels.  (grid)"],
        "policies": ["inverse ", "my_extensions:LastBest   All weight on the method closest (KL)"],
        "families": ["llava_onevision  LLaVA-OneVision", "text             a plain causal LM"],
    }
    for kind, lines in expected.items():
        assert full_grid.main(["--grid", str(grid), "--list", kind]) == 0
        printed = capsys.readouterr().out
        assert all(line in printed for line in lines), printed
    assert full_grid.main(["--grid", str(tmp_path / "missing.yaml"), "--list", "methods"]) == 0  # built-ins all the same
    assert "M  multimodal" in capsys.readouterr().out


def test_a_csv_file_with_one_image_path_per_row(tmp_path):
    from pipeline.planning.grid_file import parse_grid
    from pipeline.planning.samples import RegistrySource

    _, dataset = write_user_files(tmp_path)
    csv = dataset.parent / "mine.csv"
    csv.write_text("question,photo,category\nWhat is red?,pics/red.png,x\nAnd this?,pics/blue.png,y\n")
    entry = {"name": "flat", "path": str(csv), "images": ["photo"], "category": "ood"}
    spec = parse_grid(user_grid(dataset, datasets=[entry], drafting_methods=[], methods=["M"], policies=["static"]))
    samples = RegistrySource.for_grid(spec).first_turn("flat", None)
    assert [s.sample_id for s in samples] == ["flat/test/0/first", "flat/test/1/first"]
    assert all(len(s.images) == 1 and s.error is None and s.category == "ood" and s.answer is None for s in samples)
