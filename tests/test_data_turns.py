"""Second turns are built from a first-turn result table (SampleRecord rows), as the grid does."""
from __future__ import annotations

import datasets
import pandas as pd
import pytest
from PIL import Image

from pipeline.data import TURN_TASKS, Sample, build_second_turn, load_samples
from pipeline.data import loading
from pipeline.decoding.records import SampleRecord


def first_turn(row: int, colours: list[str], dataset: str = "iedit", error: str | None = None) -> Sample:
    images = tuple(Image.new("RGB", (4, 4), c) for c in colours)
    text = " ".join(["<image>"] * len(colours))
    return Sample(dataset, "test", row, "first", f"USER: Q{row} {text} ASSISTANT:", images, "benchmark", error)


FIRST = [first_turn(0, ["red", "green"]), first_turn(1, ["blue", "yellow"]), first_turn(2, ["white", "black"])]


def outputs_from_result_table(samples: list[Sample]) -> dict[str, str]:
    """The first-turn answers as the grid reads them back from its results (one row per record)."""
    records = [SampleRecord(sample_id=s.sample_id, mode="ar", output_text=f" Answer {s.row}.") for s in samples]
    table = pd.DataFrame([r.to_row() for r in records])
    return dict(zip(table["sample_id"], table["output_text"]))


def test_turn_tasks_are_the_papers():
    assert TURN_TASKS == ("qaorg", "captioning", "summary", "story", "nq", "gsm8k")


@pytest.mark.parametrize(
    ("task", "instruction"),
    [
        ("captioning", "Provide a detailed caption for the provided image."),
        ("summary", "Summarize the previous answer."),
        ("story", "Can you use the previous responses to write a long story for children?"),
    ],
)
def test_fixed_follow_ups(task, instruction):
    second = build_second_turn(FIRST, outputs_from_result_table(FIRST), task)
    assert [s.sample_id for s in second] == [f"iedit/test/{i}/{task}" for i in range(3)]
    assert second[1].prompt == f"USER: Q1 <image> <image> ASSISTANT: Answer 1. USER: {instruction} ASSISTANT:"
    assert second[1].images == FIRST[1].images
    assert all(s.error is None and s.category == "benchmark" for s in second)


def test_qaorg_brings_the_next_samples_prompt_and_images_and_wraps_to_the_first():
    second = build_second_turn(FIRST, outputs_from_result_table(FIRST), "qaorg")
    assert second[0].prompt == "USER: Q0 <image> <image> ASSISTANT: Answer 0. USER: Q1 <image> <image> ASSISTANT:"
    assert second[0].images == FIRST[0].images + FIRST[1].images
    assert second[2].prompt == "USER: Q2 <image> <image> ASSISTANT: Answer 2. USER: Q0 <image> <image> ASSISTANT:"
    assert second[2].images == FIRST[2].images + FIRST[0].images
    for s in second:
        s.check()


def question_copy(tmp_path, questions: list[str]) -> str:
    path = tmp_path / "validation-00000-of-00001.parquet"
    datasets.Dataset.from_dict({"question": questions, "answer": [["x"]] * len(questions)}).to_parquet(str(path))
    return str(path)


def test_nq_and_gsm8k_take_the_rows_question_from_a_local_copy(tmp_path):
    outputs = outputs_from_result_table(FIRST)
    nq = build_second_turn(FIRST, outputs, "nq", source=question_copy(tmp_path, ["who sang a", "who sang b", "when was c"]))
    assert nq[2].prompt == (
        "USER: Q2 <image> <image> ASSISTANT: Answer 2. USER: When was c. Provide a comprehensive and detailed "
        "explanation, including the reasoning and background information. ASSISTANT:"
    )
    assert nq[2].images == FIRST[2].images
    gsm = build_second_turn(FIRST, outputs, "gsm8k", source=question_copy(tmp_path, ["A?", "B has 3 apples?", "C?"]))
    assert gsm[1].prompt == (
        "USER: Q1 <image> <image> ASSISTANT: Answer 1. USER: B has 3 apples?. Provide a detailed explanation.\n"
        "Let's think step by step. ASSISTANT:"
    )


def test_text_tasks_ask_the_hub_for_nq_open_and_gsm8k(monkeypatch):
    calls = []

    def fake_load_dataset(path, config=None, *, split, streaming):
        calls.append((path, config, split))
        return datasets.Dataset.from_dict({"question": ["q0", "q1", "q2"]}).to_iterable_dataset()

    monkeypatch.setattr(loading.datasets, "load_dataset", fake_load_dataset)
    outputs = outputs_from_result_table(FIRST)
    build_second_turn(FIRST, outputs, "nq")
    build_second_turn(FIRST, outputs, "gsm8k")
    assert calls == [("google-research-datasets/nq_open", None, "validation"), ("openai/gsm8k", "main", "test")]


def test_embedded_first_turns_use_the_shipped_questions_without_network(monkeypatch):
    def no_hub(*args, **kwargs):
        raise AssertionError("the embedded set must not touch the hub")

    monkeypatch.setattr(loading.datasets, "load_dataset", no_hub)
    first = load_samples("embedded_describe", limit=52)
    outputs = outputs_from_result_table(first)
    for task in ("nq", "gsm8k"):
        second = build_second_turn(first, outputs, task)
        assert all(s.error is None and len(s.images) == 1 for s in second)
        # 50 shipped questions: row 50 wraps to question 0
        assert second[50].prompt.split("ASSISTANT: Answer 50. ")[1] == second[0].prompt.split("ASSISTANT: Answer 0. ")[1]
        assert second[1].prompt.split("Answer 1. ")[1] != second[0].prompt.split("Answer 0. ")[1]
    assert "USER: Who wrote the novel pride and prejudice. Provide a comprehensive" in build_second_turn(
        first[:1], outputs, "nq")[0].prompt


def test_failed_or_unanswered_first_turns_give_per_sample_errors():
    first = [first_turn(0, ["red"]), first_turn(1, ["blue"], error="image 0 is missing"), first_turn(2, ["green"])]
    outputs = outputs_from_result_table(first)
    del outputs["iedit/test/2/first"]
    second = build_second_turn(first, outputs, "summary")
    assert second[0].error is None
    assert "first turn failed: image 0 is missing" in second[1].error
    assert "no first-turn output for iedit/test/2/first" in second[2].error
    assert second[2].sample_id == "iedit/test/2/summary" and second[2].images == ()
    qaorg = build_second_turn(first, outputs, "qaorg")
    assert "next sample iedit/test/1/first failed" in qaorg[0].error


def test_answers_are_cleaned_and_a_placeholder_in_an_answer_is_refused():
    first = FIRST[:2]
    second = build_second_turn(first, {first[0].sample_id: " Yes.</s>", first[1].sample_id: "see <image>"}, "summary")
    assert second[0].prompt == "USER: Q0 <image> <image> ASSISTANT: Yes. USER: Summarize the previous answer. ASSISTANT:"
    assert "contains '<image>'" in second[1].error


def test_bad_calls_are_refused():
    with pytest.raises(ValueError, match="unknown second-turn task 'translate'.*qaorg"):
        build_second_turn(FIRST, {}, "translate")
    with pytest.raises(ValueError, match="one dataset"):
        build_second_turn([FIRST[0], first_turn(1, ["red"], dataset="pope")], {}, "summary")
    assert build_second_turn([], {}, "summary") == []
