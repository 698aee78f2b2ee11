"""Edge inputs a hostile or unlucky user may give `jobs/full_grid.py` end in one line on stderr and
exit 2, in under 2 s and before Ray (or transformers) is imported: never a traceback, a hang or an
out-of-memory. Each refusal runs the job as a subprocess, timed around it (interpreter start-up
included)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import parse_grid
from tests.test_run_safety import grid_file, run_job

GRID = {"name": "g", "datasets": ["embedded_vqa"], "methods": ["AR", "M"], "limit": 2,
        "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}]}
HEADER = "".join(f"{key}: {json.dumps(value)}\n" for key, value in GRID.items())


def refused(*args: str) -> str:
    """The one line the job refuses `args` with; fails on anything else."""
    start = time.monotonic()
    done = run_job(*args)
    elapsed = time.monotonic() - start
    lines = [line for line in done.stderr.splitlines() if not line.startswith("HEAVY")]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    heavy = done.stderr.split("HEAVY")[-1]
    assert "'ray'" not in heavy and "'transformers'" not in heavy, heavy
    assert elapsed < 2, f"refused after {elapsed:.2f} s: {lines[0]}"
    return lines[0]


def written(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "edge.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


@pytest.mark.parametrize("extra,words", [
    ("seed: " + "7" * 5000, ["seed", "5000 digits", "at most 30"]),
    ("temperature: " + "9" * 400, ["temperature", "400 digits"]),
    ("temperature: 1.0e+400", ["temperature[0]", "from 0 to 100", "inf"]),
    ("seed: [0, 4294967296]", ["seed[1]", "from 0 to 4,294,967,295"]),
    ("methods: " + "[" * 500 + "]" * 500, ["nests", "more than 32 deep", "line 5"]),
    ("name: " + "x" * 300, ["name 'xxxx", "300 characters", "at most 100"]),
    ("methods: [MT]\npolicies: [{kind: grid, steps: 1000000000}]", ["policies[0]", "steps", "from 1 to 100"]),
    ("methods: [MT]\nverify: [{kind: dynamic, nodes: 100000}]", ["verify[0]", "nodes", "from 1 to 512"]),
])
def test_a_field_out_of_bounds_is_refused_in_one_line(tmp_path, extra, words):
    line = refused("--grid", written(tmp_path, HEADER.replace('name: "g"\n', "") + extra + "\n"), "--dry-run")
    assert all(word in line for word in words), line


def test_a_grid_file_that_is_not_utf8_is_refused(tmp_path):
    line = refused("--grid", written(tmp_path, HEADER.encode() + "# café\n".encode("latin-1")), "--dry-run")
    assert "not UTF-8 text (byte 0xe9" in line and "save it as UTF-8" in line, line


@pytest.mark.parametrize("what", ["/dev/zero", "fifo", "directory", "large"])
def test_only_a_regular_file_of_at_most_1_mib_is_read(tmp_path, what):
    path = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "fifo"), "directory": str(tmp_path)}.get(what)
    if what == "fifo":
        os.mkfifo(path)  # reading it would wait for a writer forever
    if what == "large":
        path = written(tmp_path, HEADER + "#" * (2 << 20) + "\n")
    line = refused("--grid", path, "--dry-run")
    bound = "larger than 1,048,576 bytes" if what == "large" else "not a regular file"
    assert bound in line, line


@pytest.mark.parametrize("args,words", [
    (["--run", "r" * 300], ["--run 'rrrr", "300 characters", "at most 100"]),
    (["--workers", "-1"], ["--workers", "from 1", "'-1'"]),
    (["--cpus-per-worker", "0"], ["--cpus-per-worker", "from 0 (excluded)", "'0'"]),
    (["--cpus-per-worker", "nan"], ["--cpus-per-worker", "'nan'"]),
    (["--gpus-per-worker", "-1"], ["--gpus-per-worker", "from 0 to 64", "'-1'"]),
])
def test_bad_command_line_values_are_refused_before_ray(tmp_path, args, words):
    line = refused("--grid", str(grid_file(tmp_path)), "--out", str(tmp_path / "out"), *args)
    assert all(word in line for word in words), line


@pytest.mark.parametrize("target,context", [("tiny:target", 4096), ("embedded:target", 8192)])
def test_max_new_tokens_past_a_builtin_targets_context_is_refused_before_ray(tmp_path, target, context):
    pairs = [{"target": target, "draft": target.replace("target", "draft")}]
    grid = grid_file(tmp_path, pairs=pairs, max_new_tokens=100000)
    line = refused("--grid", str(grid), "--out", str(tmp_path / "out"))
    assert "pairs[0].target: max_new_tokens 100000" in line and f"{target} holds {context}" in line, line


def test_builtin_contexts_agree_with_the_embedded_models_config():
    from pipeline.assets.embedded import __file__ as assets
    from pipeline.planning.model_ids import KNOWN_CONTEXTS

    config = json.loads((Path(assets).parent / "small_draft" / "config.json").read_text())
    assert KNOWN_CONTEXTS["embedded:target"] == config["max_position_embeddings"]  # the draft copies it


def test_millions_of_configurations_are_refused_before_expanding_even_on_dry_run(tmp_path):
    axes = {"seed": list(range(64)), "temperature": [round(0.1 * i, 1) for i in range(1, 65)],
            "gamma": list(range(1, 65)), "window": list(range(1, 9))}
    path = written(tmp_path, HEADER + "".join(f"{key}: {json.dumps(value)}\n" for key, value in axes.items()))
    assert Path(path).stat().st_size < 2048
    line = refused("--grid", path, "--dry-run")
    assert "4,194,304 configurations" in line and "at most 10,000" in line, line
    assert "max_configurations: 4194304" in line, line


def test_max_configurations_raises_or_lowers_the_bound():
    grid = {**GRID, "temperature": [0.5, 1.0], "seed": [0, 1]}
    factors = r"8 configurations \(2 methods x 2 temperature x 2 seed\); at most 4:"
    with pytest.raises(GridError, match=factors):
        parse_grid({**grid, "max_configurations": 4})
    assert len(parse_grid({**grid, "max_configurations": 8}).configs()) == 8


def test_seeds_collapse_at_temperature_zero_keeping_the_first_seeds_keys():
    one = parse_grid({**GRID, "seed": [5]})
    three = parse_grid({**GRID, "seed": [5, 1, 2], "temperature": [0, 0.7]})
    greedy = [c for c in three.configs() if c.decode.temperature == 0]
    assert [c.key() for c in greedy] == [c.key() for c in one.configs()]  # rows written before still resume
    sampled = {c.decode.seed for c in three.configs() if c.decode.temperature > 0}
    assert sampled == {5, 1, 2}
