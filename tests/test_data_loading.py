"""Registry entries turn rows of the public schemas into the exact Appendix I prompts.

Fixture rows (tests/fixtures/data/rows.json) use the public datasets' column names; each image
is a colour name that becomes a small PNG, so the test can check image order by colour.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import datasets
import pytest
from PIL import Image, ImageColor

from pipeline.data import DATASETS, DataSourceError, get_dataset, load_samples
from pipeline.data import loading

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "data" / "rows.json").read_text(encoding="utf-8"))
INTERLEAVED = {"iedit", "magicbrush", "spot_the_diff", "pororo_sv", "vist"}
REASONING = "For the following question, provide a detailed explanation of your reasoning leading to the answer."
IEDIT = (
    "USER: Please provide instructions for editing the source image to match the target image. "
    "Source Image: <image> Target Image: <image> Instruction: ASSISTANT:"
)

# The first subset row of each dataset: exact prompt (the paper's Appendix I) and image colours in order.
EXPECTED = {
    "llava_bench": ("USER: <image>\nWhat is the name of this famous sight in the photo? ASSISTANT:", ["red"]),
    "docvqa": (f"USER: <image>\n{REASONING}\nWhat is the ‘actual’ value per 1000, during the year 1975? ASSISTANT:",
               ["green"]),
    "pope": (f"USER: <image>\n{REASONING}\nIs there a snowboard in the image? ASSISTANT:", ["blue"]),
    "mmvet": (f"USER: <image>\n{REASONING}\nWhat is x in the equation? ASSISTANT:", ["yellow"]),
    "iedit": (IEDIT, ["red", "green"]),
    "magicbrush": (IEDIT, ["blue", "yellow"]),
    "spot_the_diff": (
        "USER: Explain the disparities between the first and second image. <image> <image> Difference: ASSISTANT:",
        ["cyan", "magenta"],
    ),
    "pororo_sv": (
        "USER: Given the progression of the story with the first few images, can you write a fitting end "
        "considering the last image? <image> Caption #1: Pororo is skiing down the hill. <image> Caption #2: "
        "Crong follows Pororo. <image> Caption #3: Eddy is waiting at the bottom. <image> Caption #4: Pororo "
        "falls into the snow. <image> Caption #5: ASSISTANT:",
        ["red", "orange", "yellow", "green", "blue"],
    ),
    "vist": (
        "USER: With the narratives paired with the initial images, how would you conclude the story using the "
        "last picture? <image> Caption #1: We arrived at the beach early. <image> Caption #2: The kids built a "
        "sandcastle. <image> Caption #3: Dad went for a swim. <image> Caption #4: We had lunch under the "
        "umbrella. <image> Caption #5: ASSISTANT:",
        ["purple", "pink", "brown", "gray", "navy"],
    ),
}
IMAGE_COLUMN = re.compile(r"image(_\d+)?")  # "image", "image_0", ... but not "image_id"
PUBLIC = [name for name, spec in DATASETS.items() if spec.hub_id]  # MMSpec's folder: tests/test_mmspec_source.py


def _image_value(colour: str | None) -> dict | None:
    if colour is None:
        return None
    if colour == "GARBAGE":
        return {"bytes": b"this is not an image", "path": None}
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def fixture_dataset(name: str) -> tuple[str, datasets.Dataset]:
    """(split, Dataset) of the fixture rows for `name`, image columns typed as datasets.Image."""
    fixture = FIXTURES["interleave" if name in INTERLEAVED else name]
    rows = [
        {k: _image_value(v) if IMAGE_COLUMN.fullmatch(k) else v for k, v in row.items()}
        for row in fixture["rows"]
    ]
    dataset = datasets.Dataset.from_list(rows)
    for column in dataset.column_names:
        if IMAGE_COLUMN.fullmatch(column):
            dataset = dataset.cast_column(column, datasets.Image())
    return fixture["split"], dataset


def write_copy(name: str, tmp_path: Path, kind: str) -> Path:
    """A local copy of the fixture as the pipeline accepts it: save_to_disk or Parquet."""
    split, dataset = fixture_dataset(name)
    if kind == "save_to_disk":
        path = tmp_path / f"{name}_disk"
        # an extra split proves the registry's split is the one picked
        datasets.DatasetDict({split: dataset, "other": dataset.select([0])}).save_to_disk(str(path))
        return path
    path = tmp_path / f"{name}_parquet"
    path.mkdir()
    dataset.to_parquet(str(path / f"{split}-00000-of-00001.parquet"))
    dataset.select([0]).to_parquet(str(path / "other-00000-of-00001.parquet"))
    return path


def colours(sample) -> list[tuple[int, int, int]]:
    return [image.getpixel((0, 0)) for image in sample.pixels()]


def test_every_public_dataset_has_a_fixture_and_an_expected_prompt():
    assert sorted(PUBLIC) == sorted(EXPECTED)


@pytest.mark.parametrize("kind", ["save_to_disk", "parquet"])
@pytest.mark.parametrize("name", PUBLIC)
def test_first_row_becomes_the_appendix_i_prompt(name, kind, tmp_path):
    samples = load_samples(name, source=write_copy(name, tmp_path, kind))
    first = samples[0]
    prompt, expected_colours = EXPECTED[name]
    assert first.error is None
    assert first.prompt == prompt
    assert colours(first) == [ImageColor.getrgb(c) for c in expected_colours]
    spec = get_dataset(name)
    assert first.sample_id == f"{name}/{spec.split}/0/first"
    assert first.category == spec.category
    assert all(image.mode == "RGB" for image in first.pixels())


def test_interleave_rows_are_filtered_by_sub_task_and_numbered_within_it(tmp_path):
    samples = load_samples("iedit", source=write_copy("iedit", tmp_path, "parquet"))
    assert [s.row for s in samples] == [0, 1, 2]
    assert colours(samples[1]) == [ImageColor.getrgb("navy"), ImageColor.getrgb("olive")]
    assert [s.sample_id for s in samples][:2] == ["iedit/test/0/first", "iedit/test/1/first"]


def test_limit_takes_the_first_rows_and_defaults_follow_the_paper(tmp_path):
    assert load_samples("iedit", source=write_copy("iedit", tmp_path, "parquet"), limit=1)[0].row == 0
    assert len(load_samples("iedit", source=tmp_path / "iedit_parquet", limit=2)) == 2
    assert get_dataset("llava_bench").default_limit == 60
    assert {DATASETS[n].default_limit for n in PUBLIC if n != "llava_bench"} == {100}
    with pytest.raises(ValueError, match="limit"):
        load_samples("iedit", source=tmp_path / "iedit_parquet", limit=0)


def test_paper_categories():
    assert {n for n in PUBLIC if DATASETS[n].category == "ood"} == {"pororo_sv", "vist"}
    assert {DATASETS[n].category for n in PUBLIC} == {"benchmark", "ood"}


@pytest.mark.parametrize(
    ("name", "row", "message"),
    [
        ("llava_bench", 1, "image 0 cannot be read"),
        ("pope", 1, "image 0 is missing"),
        ("iedit", 2, "2 <image> placeholder(s) but 1 image(s)"),
    ],
)
def test_bad_rows_give_per_sample_errors_not_a_crash(name, row, message, tmp_path):
    samples = load_samples(name, source=write_copy(name, tmp_path, "save_to_disk"))
    bad = samples[row]
    assert bad.error is not None and message in bad.error
    assert bad.sample_id in bad.error
    assert bad.images == ()
    assert samples[0].error is None  # the rest of the run is unaffected


def test_unknown_dataset_lists_the_known_names():
    with pytest.raises(ValueError, match="unknown dataset 'chartqa'.*llava_bench.*embedded_story"):
        get_dataset("chartqa")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_samples("chartqa")


def test_missing_or_malformed_local_copy_names_the_dataset(tmp_path):
    with pytest.raises(DataSourceError, match=r"dataset 'pope': local copy .*nowhere does not exist"):
        load_samples("pope", source=tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataSourceError, match="neither a datasets.save_to_disk directory nor Parquet"):
        load_samples("pope", source=tmp_path / "empty")


def test_a_copy_without_the_needed_columns_is_refused(tmp_path):
    _, dataset = fixture_dataset("mmvet")
    dataset.remove_columns("question").to_parquet(str(tmp_path / "test.parquet"))
    with pytest.raises(DataSourceError, match=r"dataset 'mmvet'.*lacks column\(s\) \['question'\]"):
        load_samples("mmvet", source=tmp_path / "test.parquet")


def test_save_to_disk_copy_with_other_split_names(tmp_path):
    split_, dataset = fixture_dataset("docvqa")
    # the authors' download script renames splits to 'test': a single split is taken whatever its name
    datasets.DatasetDict({"test": dataset}).save_to_disk(str(tmp_path / "single"))
    assert load_samples("docvqa", source=tmp_path / "single")[0].prompt == EXPECTED["docvqa"][0]
    datasets.DatasetDict({"a": dataset, "b": dataset}).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(DataSourceError, match="splits \\['a', 'b'\\], none named 'lite'"):
        load_samples("docvqa", source=tmp_path / "two")


@pytest.mark.parametrize("name", PUBLIC)
def test_hub_loading_asks_for_the_public_source(name, monkeypatch):
    calls = []

    def fake_load_dataset(path, config=None, *, split, streaming):
        calls.append((path, config, split, streaming))
        return fixture_dataset(name)[1].to_iterable_dataset()

    monkeypatch.setattr(loading.datasets, "load_dataset", fake_load_dataset)
    samples = load_samples(name, limit=1)
    spec = get_dataset(name)
    assert calls == [(spec.hub_id, spec.config, spec.split, True)]
    assert samples[0].prompt == EXPECTED[name][0]


def test_hub_sources_match_the_paper():
    hub = {n: (DATASETS[n].hub_id, DATASETS[n].config, DATASETS[n].split, DATASETS[n].sub_task) for n in PUBLIC}
    assert hub == {
        "llava_bench": ("lmms-lab/llava-bench-in-the-wild", None, "train", None),
        "docvqa": ("lmms-lab/LMMs-Eval-Lite", "docvqa_val", "lite", None),
        "pope": ("lmms-lab/POPE", None, "test", None),
        "mmvet": ("lmms-lab/MMVet", None, "test", None),
        "iedit": ("lmms-lab/LLaVA-NeXT-Interleave-Bench", "in_domain", "test", "IEdit"),
        "magicbrush": ("lmms-lab/LLaVA-NeXT-Interleave-Bench", "in_domain", "test", "MagicBrush"),
        "spot_the_diff": ("lmms-lab/LLaVA-NeXT-Interleave-Bench", "in_domain", "test", "Spot-the-Diff"),
        "pororo_sv": ("lmms-lab/LLaVA-NeXT-Interleave-Bench", "in_domain", "test", "PororoSV"),
        "vist": ("lmms-lab/LLaVA-NeXT-Interleave-Bench", "in_domain", "test", "VIST"),
    }


def test_unreachable_hub_says_to_pass_a_local_copy(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(loading.datasets, "load_dataset", offline)
    with pytest.raises(DataSourceError, match=r"dataset 'mmvet': cannot open lmms-lab/MMVet .*no route.*local"):
        load_samples("mmvet")


def test_fetch_writes_a_local_subset_that_loads_like_the_hub(monkeypatch, tmp_path, capsys):
    from pipeline.data import fetch

    def fake_load_dataset(path, config=None, *, split, streaming):
        if path == "openai/gsm8k":
            return datasets.Dataset.from_dict({"question": ["q0", "q1"], "answer": ["a0", "a1"]}).to_iterable_dataset()
        return fixture_dataset("iedit")[1].to_iterable_dataset()

    monkeypatch.setattr(loading.datasets, "load_dataset", fake_load_dataset)
    fetch.main([str(tmp_path), "iedit", "gsm8k"])
    assert "iedit: " in capsys.readouterr().out
    saved = datasets.load_from_disk(str(tmp_path / "iedit"))
    assert list(saved) == ["test"] and set(saved["test"]["sub_task"]) == {"IEdit"}  # only the subset is kept
    local = load_samples("iedit", source=tmp_path / "iedit")
    assert [(s.prompt, colours(s), s.error) for s in local] == [
        (s.prompt, colours(s), s.error) for s in load_samples("iedit")
    ]
    assert local[0].prompt == EXPECTED["iedit"][0]
    assert datasets.load_from_disk(str(tmp_path / "gsm8k"))["test"]["question"] == ["q0", "q1"]
    with pytest.raises(SystemExit):
        fetch.main([str(tmp_path), "embedded_vqa"])


def test_a_dataset_lmms_eval_moved_is_read_under_its_new_name_and_says_so(monkeypatch, caplog):
    calls = []

    def moved(path, config=None, *, split, streaming):
        calls.append(path)
        if path.startswith("lmms-lab/"):
            raise FileNotFoundError(f"Dataset '{path}' doesn't exist on the Hub")
        return fixture_dataset("mmvet")[1].to_iterable_dataset()

    monkeypatch.setattr(loading.datasets, "load_dataset", moved)
    with caplog.at_level("WARNING", logger="pipeline.data.loading"):
        samples = load_samples("mmvet", limit=1)
    assert calls == ["lmms-lab/MMVet", "lmms-lab-encoder/MMVet"] and samples[0].prompt == EXPECTED["mmvet"][0]
    assert "read lmms-lab-encoder/MMVet" in caplog.text and "lmms-lab/MMVet" in caplog.text
    assert loading.hub_names("org/other") == ["org/other"]  # only lmms-lab's moved
