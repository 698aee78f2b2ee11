"""MMSpec's dataset as a source: a folder of mmspec.jsonl and images/, read from the grid's
`sources` (never a download), one dataset per topic, and its own follow-up questions as turns."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from PIL import Image

from pipeline.data import DataSourceError, build_followup, load_samples
from pipeline.data.prompts import continue_conversation, image_question, user_turn
from pipeline.data.sample import turn_count
from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import parse_grid
from pipeline.planning.samples import RegistrySource

ROWS = [
    {"id": "mmspec_001", "image": "mmspec_001.jpg", "turns": ["Which shape is the table?"],
     "topic": "general vqa"},
    {"id": "mmspec_101", "image": "mmspec_101.png", "turns": ["What does it say?"], "topic": "text vqa"},
    {"id": "mmspec_501", "image": "mmspec_501.jpg", "turns": ["What is in the sky?", "Why is it bright?",
                                                             "Name another one."],
     "category": "Astronomy", "topic": "multi-turn conversation"},
    {"id": "mmspec_502", "image": "mmspec_502.png", "turns": ["Who is there?", "What are they doing?"],
     "topic": "multi-turn conversation"},
    {"id": "mmspec_503", "image": "../outside.png", "turns": ["q1", "q2"],
     "topic": "multi-turn conversation"},
    {"id": "mmspec_504", "image": "missing.jpg", "turns": ["q1", "q2"], "topic": "multi-turn conversation"},
]
COLOURS = {"mmspec_001.jpg": (220, 20, 20), "mmspec_101.png": (20, 20, 220),
           "mmspec_501.jpg": (20, 200, 20), "mmspec_502.png": (240, 240, 20)}
PAIR = {"target": "tiny:target", "draft": "tiny:draft"}


@pytest.fixture
def mmspec_dir(tmp_path) -> Path:
    """A tiny split in MMSpec's layout, plus an image just outside its images/ folder."""
    folder = tmp_path / "MMSpec" / "test"
    (folder / "images").mkdir(parents=True)
    for name, colour in COLOURS.items():
        Image.new("RGB", (40, 30), colour).save(folder / "images" / name)
    Image.new("RGB", (40, 30), (0, 0, 0)).save(folder / "outside.png")
    rows = [{"category": "default", **row} for row in ROWS]
    (folder / "mmspec.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return folder


def grid(folder: Path | None, **fields) -> dict:
    sources = {"sources": {"mmspec": str(folder)}} if folder else {}
    return {"name": "mm", "datasets": ["mmspec"], "pairs": [PAIR], "methods": ["AR", "M"],
            "max_new_tokens": 4, **sources, **fields}


def test_rows_become_image_first_prompts_with_their_ids_and_follow_ups(mmspec_dir):
    samples = RegistrySource.for_grid(parse_grid(grid(mmspec_dir))).first_turn("mmspec", None)
    assert [s.source_id for s in samples] == [row["id"] for row in ROWS]
    assert [s.sample_id for s in samples[:2]] == ["mmspec/test/0/first", "mmspec/test/1/first"]
    assert samples[2].prompt == image_question("What is in the sky?")
    assert samples[2].prompt == "USER: <image>\nWhat is in the sky? ASSISTANT:"
    assert samples[2].category == "benchmark"
    assert samples[3].pixels()[0].getpixel((0, 0)) == COLOURS["mmspec_502.png"]
    assert samples[2].pixels()[0].size == (40, 30)  # a JPEG: its pixels are approximate
    assert samples[2].followups == ("Why is it bright?", "Name another one.") and samples[0].followups == ()
    assert [s.error for s in samples[:4]] == [None] * 4


@pytest.mark.parametrize("name, ids", [
    ("mmspec_general_vqa", ["mmspec_001"]),
    ("mmspec_text_vqa", ["mmspec_101"]),
    ("mmspec_multi_turn", ["mmspec_501", "mmspec_502", "mmspec_503", "mmspec_504"]),
    ("mmspec_chart_understanding", []),
])
def test_each_topic_reads_the_same_folder(mmspec_dir, name, ids):
    source = RegistrySource({"mmspec": str(mmspec_dir)})
    if not ids:  # a topic the copy lacks: no rows, refused before Ray starts by the preflight
        assert source.first_turn(name, None) == []
        return
    samples = source.first_turn(name, None)
    assert [s.source_id for s in samples] == ids
    assert [s.row for s in samples] == list(range(len(ids)))
    assert samples[0].sample_id == f"{name}/test/0/first"


def test_an_image_outside_images_or_missing_fails_its_sample_only(mmspec_dir):
    escaped, missing = load_samples("mmspec_multi_turn", source=mmspec_dir)[2:]
    assert "image path '../outside.png' leaves the dataset folder" in escaped.error
    assert str((mmspec_dir / "images").resolve()) in escaped.error
    assert "allow_outside_paths" not in escaped.error  # a registered dataset has no such option
    assert "image file 'missing.jpg' does not exist" in missing.error
    assert escaped.images == missing.images == () and missing.followups == ("q2",)


def test_without_a_source_the_grid_is_refused_naming_the_entry_to_add(mmspec_dir):
    with pytest.raises(GridError) as err:
        parse_grid(grid(None, datasets=["mmspec", "mmspec_text_vqa"]))
    assert str(err.value) == ("datasets ['mmspec', 'mmspec_text_vqa'] are on no hub this pipeline can load: "
                              "add their local copy to the grid, sources: {mmspec: /path/to/copy}")
    with pytest.raises(GridError, match="'mmspec_text_vqa' reads the copy named sources.mmspec"):
        parse_grid(grid(None, datasets=["mmspec_text_vqa"], sources={"mmspec_text_vqa": str(mmspec_dir)}))
    with pytest.raises(DataSourceError, match=r"sources: \{mmspec: /path/to/copy\}"):
        load_samples("mmspec_text_vqa")


def test_follow_up_turns_continue_the_given_answers(mmspec_dir):
    first = load_samples("mmspec_multi_turn", source=mmspec_dir)
    answers = {first[0].sample_id: "A moon.", first[1].sample_id: "Two kids."}
    second = build_followup(first, answers, "followup")
    assert [(s.source_id, s.turn, s.row) for s in second] == [
        ("mmspec_501", "followup", 0), ("mmspec_502", "followup", 1), ("mmspec_503", "followup", 2),
        ("mmspec_504", "followup", 3)]
    follow = user_turn("Why is it bright?")
    assert second[0].prompt == continue_conversation(first[0].prompt, "A moon.", follow)
    assert second[0].prompt == ("USER: <image>\nWhat is in the sky? ASSISTANT: A moon. "
                                "USER: Why is it bright? ASSISTANT:")
    assert second[0].images == first[0].images and second[0].error is None
    assert "the first turn failed" in second[2].error and "does not exist" in second[3].error
    third = build_followup(second, {second[0].sample_id: "It reflects the sun."}, "followup2")
    assert [s.source_id for s in third] == ["mmspec_501"]  # the others have two questions only
    assert third[0].prompt == f"{second[0].prompt} It reflects the sun. USER: Name another one. ASSISTANT:"
    assert third[0].sample_id == "mmspec_multi_turn/test/0/followup2"
    assert build_followup(third, {}, "followup3") == []
    assert [turn_count(first, t) for t in ("first", "followup", "followup2", "followup3")] == [4, 4, 1, 0]
    unanswered = build_followup(first[:1], {}, "followup")[0]
    assert unanswered.error.endswith("no first-turn output for mmspec_multi_turn/test/0/first")


def test_follow_ups_are_refused_for_datasets_without_their_own(mmspec_dir):
    with pytest.raises(GridError) as err:
        parse_grid(grid(mmspec_dir, datasets=["mmspec", "embedded_vqa"], turns=["first", "followup2"]))
    message = str(err.value)
    assert "datasets[1] 'embedded_vqa' has no follow-up questions of its own for turns" in message
    assert "turns: 'followup2' continues the 'followup' turn; add it to turns" in message
    spec = parse_grid(grid(mmspec_dir, turns=["first", "followup", "followup2", "qaorg"]))
    assert spec.second_turns == ("followup", "followup2", "qaorg")


@pytest.fixture
def ray_local(tmp_path):
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=2, num_gpus=1, _node_ip_address="127.0.0.1", include_dashboard=False,
             runtime_env={"env_vars": {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1",
                                       "TABED_TINY_DIR": str(tmp_path / "tiny")}})
    yield
    ray.shutdown()


@pytest.mark.slow
def test_a_grid_runs_first_and_follow_up_turns(mmspec_dir, ray_local, tmp_path):
    """First turns, then follow-ups built from the target's own stored answers, in phases."""
    from actors.runner import GridRunner
    from pipeline.storage.store import read_results

    spec = parse_grid(grid(mmspec_dir, datasets=["mmspec_multi_turn"], methods=["AR"], mode="replay",
                           turns=["first", "followup", "followup2"]))
    stream = io.StringIO()
    report = GridRunner(spec, tmp_path / "out", workers=1, stream=stream).run()
    rows = read_results(tmp_path / "out").sort_values(["turn", "row"])
    assert sorted(rows.groupby("turn").size().items()) == [("first", 4), ("followup", 4), ("followup2", 1)]
    assert report.rows_written == 9 and "[third turn]" in stream.getvalue()
    first = rows[(rows.turn == "first") & (rows.row == 0)].iloc[0]
    follow = rows[(rows.turn == "followup") & (rows.row == 0)].iloc[0]
    assert follow.source_id == "mmspec_501" and not isinstance(follow.error, str) and first.output_text
    failed = rows[(rows.turn == "followup") & rows.error.notna()]
    assert list(failed.error_category) == ["input", "input"]  # the escaped and the missing image
