"""Hostile or careless input is refused before it costs anything: a decompression-bomb image
(an `input` error row in a public dataset, one line and exit 2 in a user's own file), image
paths that leave the dataset folder, a run name that leaves OUT, a YAML alias bomb, an absurd
gamma, and prompts or budgets that do not fit the model's context."""
from __future__ import annotations

import json
import struct
import time
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data import load_samples
from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import speculative_decode
from pipeline.models.base import ModelInputError
from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import load_grid
from tests.conftest import solid
from tests.test_run_safety import grid_file, run_job


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims `width` x `height` (1-bit grey) and holds one compressed row: a few
    dozen bytes that would decode into gigabytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side,message", [(30000, "decompression bomb"), (10000, "above the pixel budget of 64 Mpx")])
def test_a_bomb_image_in_a_public_dataset_is_an_input_error_row(tmp_path, side, message):
    copy = tmp_path / "docvqa.parquet"
    good = (tmp_path / "ok.png")
    solid((10, 200, 10)).save(good)
    images = [{"bytes": png_header(side, side), "path": None}, {"bytes": good.read_bytes(), "path": None}]
    pq.write_table(pa.table({"question": ["what is it?", "and this?"], "image": images}), copy)
    bomb, fine = load_samples("docvqa", source=copy, limit=2)
    assert message in bomb.error and not fine.error  # the run records it and goes on


def test_the_pixel_budget_is_a_grid_field(tmp_path):
    copy = tmp_path / "docvqa.parquet"
    pq.write_table(pa.table({"question": ["q?"], "image": [{"bytes": png_header(3000, 3000), "path": None}]}), copy)
    refused = load_samples("docvqa", source=copy, limit=1, max_image_pixels=4_000_000)[0]
    assert "9000x" not in refused.error and "3000x3000 (9 Mpx), above the pixel budget of 4 Mpx" in refused.error
    spec = load_grid(grid_file(tmp_path, max_image_pixels=4_000_000))
    assert spec.max_image_pixels == 4_000_000


def user_grid(tmp_path: Path, images: list[str], **entry) -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "rows.jsonl").write_text("".join(json.dumps({"question": "What is it?", "image": i}) + "\n" for i in images))
    return grid_file(tmp_path, datasets=[{"name": "mine", "path": "data/rows.jsonl", **entry}])


def test_a_bomb_image_in_a_users_file_fails_before_ray_in_one_line(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bomb.png").write_bytes(png_header(30000, 30000))
    done = run_job("--grid", str(user_grid(tmp_path, ["bomb.png"])), "--out", str(tmp_path / "out"))
    lines = [line for line in done.stderr.splitlines() if not line.startswith("HEAVY")]
    assert done.returncode == 2 and len(lines) == 1 and "decompression bomb" in lines[0], done.stderr
    assert "'ray'" not in done.stderr.split("HEAVY")[-1]


@pytest.mark.parametrize("where", ["../outside/x.png", "ABSOLUTE", "../../../../../../etc/passwd"])
def test_image_paths_stay_inside_the_dataset_folder(tmp_path, where):
    outside = tmp_path / "outside"
    outside.mkdir()
    solid((200, 10, 10)).save(outside / "x.png")
    path = str(outside / "x.png") if where == "ABSOLUTE" else where
    done = run_job("--grid", str(user_grid(tmp_path, [path])), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "leaves the dataset folder" in done.stderr, done.stderr
    spec = load_grid(user_grid(tmp_path, [str(outside / "x.png")], allow_outside_paths=True))
    from pipeline.data.registry import user_dataset_spec
    assert not load_samples(user_dataset_spec(spec.user_datasets[0]))[0].error  # allowed on purpose


def test_the_run_name_cannot_leave_out(tmp_path):
    for run in ("../x", "../../../x", ".."):
        done = run_job("--grid", str(grid_file(tmp_path)), "--out", str(tmp_path / "out"), "--run", run)
        assert done.returncode == 2 and "--run" in done.stderr and "names a directory" in done.stderr, done.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "out").exists()
    from pipeline.storage.store import report_dir

    assert report_dir(tmp_path, "../x").parent == tmp_path  # quoted, as run=<run> is


def alias_bomb(levels: int = 9) -> str:
    """A valid grid but for `methods`: nine lists of nine aliases each, nested nine deep, is
    451 bytes that stand for 9**9 entries (before the check: past 10 GB and 2 minutes)."""
    names = "abcdefghi"[:levels]
    lists = ["&a [M, M, M, M, M, M, M, M, M]"] + [f"&{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip(names, names[1:])]
    return ('datasets: [embedded_vqa]\npairs: [{target: "tiny:target", draft: "tiny:draft"}]\n'
            f"methods: [[{', '.join(lists)}]]\n")


def test_a_yaml_alias_bomb_is_refused_in_milliseconds(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    start = time.monotonic()
    with pytest.raises(GridError, match="expands .* to more than 100,000 entries"):
        load_grid(path)
    assert time.monotonic() - start < 2
    path.write_text(alias_bomb(levels=3))  # 9**3 entries: refused for what they are, not for their number
    with pytest.raises(GridError, match=r"methods\[0\]"):
        load_grid(path)
    path.write_text("a: &a [*a]\nmethods: *a\n")  # an alias inside itself
    with pytest.raises(GridError, match="expands"):
        load_grid(path)
    path.write_text("name: big\n# " + "x" * (2 << 20) + "\n")
    with pytest.raises(GridError, match="a grid file holds at most"):
        load_grid(path)


def test_gamma_has_an_upper_bound(tmp_path):
    with pytest.raises(GridError, match=r"gamma\[0\]: expected an integer from 1 to 64, got 10000"):
        load_grid(grid_file(tmp_path, gamma=[10000]))


def test_max_new_tokens_past_the_targets_context_is_refused_before_ray(tmp_path, tiny_dirs):
    pairs = [{"target": str(tiny_dirs["target"]), "draft": str(tiny_dirs["draft"])}]
    done = run_job("--grid", str(grid_file(tmp_path, pairs=pairs, max_new_tokens=100000)), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "pairs[0].target: max_new_tokens 100000" in done.stderr, done.stderr
    assert "holds 4096" in done.stderr and "'ray'" not in done.stderr.split("HEAVY")[-1]


def test_a_prompt_longer_than_the_context_is_an_input_error(tiny_pair):
    from pipeline.execution.failures import error_category

    target, draft = tiny_pair
    long = Sample("unit", "test", 0, "first", "USER: <image>\n" + "word " * 5000 + "ASSISTANT:", (solid((1, 2, 3)),))
    with pytest.raises(ModelInputError, match="the model's context holds 4096") as refused:
        speculative_decode(target, draft, [long], DecodeConfig(methods="M", max_new_tokens=8))[0]
    assert error_category(refused.value) == "input"


def test_a_huge_prompt_line_is_refused_before_it_is_tokenized(tiny_pair, monkeypatch):
    """10 MB of text (an MMSpec source row), which the tokenizer would chew on for a minute: its
    length alone says it cannot fit, so no tokenizer ever sees it."""
    from pipeline.execution.failures import error_category

    target, draft = tiny_pair
    huge = Sample("unit", "test", 0, "first", "USER: <image>\n" + "word " * 2_000_000 + "ASSISTANT:",
                  (solid((1, 2, 3)),))
    for model in (target, draft):
        monkeypatch.setattr(model, "tokenize_prompt", lambda text: pytest.fail("the huge prompt was tokenized"))
    with pytest.raises(ModelInputError, match="10,000,024 characters need more than") as refused:
        speculative_decode(target, draft, [huge], DecodeConfig(methods="M", max_new_tokens=8))
    assert error_category(refused.value) == "input" and "context holds 4096" in str(refused.value)


@pytest.mark.parametrize("verify", ["chain", "candidates", {"kind": "shape", "shape": [2, 2, 1, 1, 1, 1, 1, 1]}])
def test_the_draft_never_runs_more_steps_than_the_tokens_left(tiny_pair, monkeypatch, verify):
    """gamma 8 and 5 new tokens: a block drafts at most the tokens the sample may still produce
    (a block keeps no more), and the output is still the target's own."""
    from pipeline.decoding.loop import autoregressive_decode
    from pipeline.planning.verify_entries import make_verify

    target, draft = tiny_pair
    calls = []
    real = type(draft).logits
    monkeypatch.setattr(type(draft), "logits", lambda self, **kw: calls.append(self is draft) or real(self, **kw))
    case = Sample("unit", "test", 0, "first", "USER: <image>\nDescribe it. ASSISTANT:", (solid((200, 30, 30)),))
    config = DecodeConfig(methods="MT", gamma=8, max_new_tokens=5, verify=make_verify(verify))
    record = speculative_decode(target, draft, [case], config, None)[0]
    assert record.output_ids == autoregressive_decode(target, [case], max_new_tokens=5)[0].output_ids
    produced, allowed = 0, 0
    for accepted in record.accepted_per_block:
        allowed += min(8, 5 - produced)  # forwards the block may run: never past the budget
        produced += accepted + 1
    assert 0 < sum(calls) - 1 <= allowed < 8 * len(record.accepted_per_block)  # less the prefill
