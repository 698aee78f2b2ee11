"""The embedded scenarios load offline and yield open prompts with real easy-VQA images."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.data import DATASETS, get_dataset, load_samples
from pipeline.data import loading
from pipeline.data.embedded import scenarios

EMBEDDED = {"embedded_vqa": 1, "embedded_describe": 1, "embedded_compare": 2, "embedded_story": 5, "embedded_gallery": 20,
            "embedded_quote": 1}
EMBEDDED_DIR = Path(scenarios.__file__).parent


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("embedded scenarios must not touch the hub")

    monkeypatch.setattr(loading.datasets, "load_dataset", refuse)


def test_registry_holds_the_embedded_set():
    assert {n for n, spec in DATASETS.items() if spec.embedded} == set(EMBEDDED)
    assert get_dataset("embedded_story").category == "ood"


@pytest.mark.parametrize(("name", "n_images"), EMBEDDED.items())
def test_embedded_dataset_loads_offline_with_images(name, n_images):
    samples = load_samples(name)
    assert len(samples) == 100
    assert [s.row for s in samples] == list(range(100))
    for sample in samples:
        assert sample.error is None
        assert len(sample.images) == n_images
        sample.check()
        assert sample.prompt.startswith("USER: ") and sample.prompt.endswith(" ASSISTANT:")
        assert all(image.size == (64, 64) and image.mode == "RGB" for image in sample.pixels())
    assert len({s.prompt for s in samples}) > 1


def test_describe_prompts_are_open_requests_and_images_follow_the_test_split_order():
    samples = load_samples("embedded_describe", limit=4)
    assert samples[0].prompt == "USER: <image>\nDescribe the image in detail. ASSISTANT:"
    assert samples[2].prompt == "USER: <image>\nWrite a short story about this picture. ASSISTANT:"
    compare = load_samples("embedded_compare", limit=2)
    # pair k holds test images 2k and 2k+1, the same pixels describe rows 2k and 2k+1 show
    pair = compare[1].pixels()
    assert list(pair[1].getdata()) == list(samples[3].pixels()[0].getdata())
    assert list(pair[0].getdata()) != list(pair[1].getdata())


def test_story_captions_state_the_colour_and_shape_of_their_images():
    facts = scenarios.shape_facts()
    assert len(facts) > 800  # most test images have both stated by their questions
    assert facts[0] == ("red", "triangle")  # "what is the red shape?" -> "triangle"
    assert facts[1] == ("yellow", "rectangle")  # "what is the color of the rectangle?" -> "yellow"
    first = load_samples("embedded_story", limit=1)[0]
    assert first.prompt.startswith(
        "USER: Given the progression of the story with the first few images, can you write a fitting end "
        "considering the last image? <image> Caption #1: First, a red triangle appears. <image> Caption #2: "
        "Then a yellow rectangle comes along."
    )
    assert first.prompt.endswith("<image> Caption #5: ASSISTANT:")


def test_an_embedded_dataset_takes_no_source(tmp_path):
    with pytest.raises(ValueError, match="ships with the project"):
        load_samples("embedded_vqa", source=tmp_path)


def test_shipped_question_lists_and_size():
    for name in ("gsm8k_like.jsonl", "nq_like.jsonl"):
        lines = (EMBEDDED_DIR / name).read_text(encoding="utf-8").splitlines()
        questions = [json.loads(line)["question"] for line in lines]
        assert len(questions) == len(set(questions)) == 50
        assert all(q.strip() == q and q for q in questions)
    assert sum(f.stat().st_size for f in EMBEDDED_DIR.iterdir() if f.is_file()) < 5 * 2**20
    assert "Sources and licences" in (EMBEDDED_DIR / "README.md").read_text(encoding="utf-8")
