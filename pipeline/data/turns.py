"""Second turns built from the pipeline's own first-turn results (as the authors' reference code builds them).

A second-turn prompt is the first-turn prompt, the target's first-turn answer, and a new user
turn (format in `pipeline.data.prompts`). The new turn is, per task:

- ``qaorg``: the NEXT sample's first-turn prompt, with its images appended (the last sample
  wraps to the first);
- ``captioning`` / ``summary`` / ``story``: a fixed instruction (the reference's wording);
- ``nq`` / ``gsm8k``: the question of the same row of NQ-open (validation) or GSM8K (main,
  test), wrapped in the reference's instruction. Questions come from the hub, a local copy
  (`source`), or, for embedded first turns, the project's own offline lists.

A second-turn Sample keeps the first's dataset, split, row and category; its `turn` is the
task name. When the first turn failed or has no answer, the second turn carries an error.

A dataset with questions of its own (MMSpec's `turns`, kept as `Sample.followups`) continues
with them instead (`build_followup`): ``followup`` asks its second question after the first
turn's answer, ``followup2`` its third after the ``followup`` answer, ``followup3`` its fourth.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Mapping, Sequence

from pipeline.data.prompts import PromptError, continue_conversation, user_turn
from pipeline.data.registry import is_embedded
from pipeline.data.sample import FIRST_TURN, FOLLOWUP_TURNS, Sample, previous_turn, turn_index

TURN_TASKS: tuple[str, ...] = ("qaorg", "captioning", "summary", "story", "nq", "gsm8k")

FIXED_INSTRUCTIONS: dict[str, str] = {
    "captioning": "Provide a detailed caption for the provided image.",
    "summary": "Summarize the previous answer.",
    "story": "Can you use the previous responses to write a long story for children?",
}

EMBEDDED_DIR = Path(__file__).parent / "embedded"


def _nq_turn(question: str) -> str:
    return (
        f"{question.capitalize()}. Provide a comprehensive and detailed explanation, "
        "including the reasoning and background information."
    )


def _gsm8k_turn(question: str) -> str:
    # Joined with ". " exactly as the reference did, even though GSM8K questions end in "?".
    return f"{question}. Provide a detailed explanation.\nLet's think step by step."


@dataclass(frozen=True)
class QuestionSet:
    """Where a text-only task's questions come from and how one becomes the user's text."""

    hub_id: str
    config: str | None
    split: str
    embedded_file: str  # JSON Lines of {"question": ...} in EMBEDDED_DIR
    to_text: Callable[[str], str]


QUESTION_SETS: dict[str, QuestionSet] = {
    "nq": QuestionSet("google-research-datasets/nq_open", None, "validation", "nq_like.jsonl", _nq_turn),
    "gsm8k": QuestionSet("openai/gsm8k", "main", "test", "gsm8k_like.jsonl", _gsm8k_turn),
}


def load_questions(
    task: str, count: int, *, source: str | os.PathLike | None = None, embedded: bool = False
) -> list[str]:
    """Up to `count` questions for text-only task `task` ("nq" or "gsm8k"), in order.

    `source` (a save_to_disk directory or Parquet copy with a `question` column) wins over the
    embedded lists, which win over the hub.
    """
    spec = QUESTION_SETS[task]
    if source is None and embedded:
        path = EMBEDDED_DIR / spec.embedded_file
        with path.open(encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    else:
        from pipeline.data.loading import open_rows  # `datasets`: only when questions are read

        rows = open_rows(task, spec.hub_id, spec.config, spec.split, source, ("question",))
    questions = [row["question"] for row in islice(rows, count)]
    if not questions:
        raise ValueError(f"task {task!r}: the question source holds no questions")
    return questions


def build_second_turn(
    first_samples: Sequence[Sample],
    first_outputs: Mapping[str, str],
    task: str,
    *,
    source: str | os.PathLike | None = None,
) -> list[Sample]:
    """Second-turn Samples of task `task` for first-turn Samples of one dataset.

    `first_outputs` maps a first-turn sample_id to the target's answer text. `source` is a
    local copy of the NQ-open / GSM8K questions (used by "nq" and "gsm8k" only). Row i takes
    question i, wrapping around when a question list is shorter than the run (only the
    embedded lists are).
    """
    if task not in TURN_TASKS:
        raise ValueError(f"unknown second-turn task {task!r}; known: {', '.join(TURN_TASKS)}")
    if not first_samples:
        return []
    datasets_seen = {s.dataset for s in first_samples}
    if len(datasets_seen) != 1 or any(s.turn != FIRST_TURN for s in first_samples):
        raise ValueError(
            "build_second_turn needs first-turn samples of one dataset; got datasets "
            f"{sorted(datasets_seen)} and turns {sorted({s.turn for s in first_samples})}"
        )
    questions: list[str] = []
    if task in QUESTION_SETS:
        embedded = is_embedded(first_samples[0].dataset)
        needed = max(s.row for s in first_samples) + 1
        questions = load_questions(task, needed, source=source, embedded=embedded)

    result = []
    for position, first in enumerate(first_samples):
        second = dataclasses.replace(first, turn=task, prompt="", images=(), error=None, answer=None)
        try:
            prompt, images = _second_turn(first, first_samples, position, first_outputs, task, questions)
        except PromptError as exc:
            result.append(dataclasses.replace(second, error=f"sample {second.sample_id}: {exc}"))
            continue
        result.append(dataclasses.replace(second, prompt=prompt, images=images))
    return result


def _second_turn(
    first: Sample,
    first_samples: Sequence[Sample],
    position: int,
    first_outputs: Mapping[str, str],
    task: str,
    questions: Sequence[str],
) -> tuple[str, tuple]:
    if first.error:
        raise PromptError(f"the first turn failed: {first.error}")
    answer = first_outputs.get(first.sample_id)
    if answer is None:
        raise PromptError(f"no first-turn output for {first.sample_id}")
    images = first.images
    if task == "qaorg":
        following = first_samples[(position + 1) % len(first_samples)]
        if following.error:
            raise PromptError(f"the next sample {following.sample_id} failed: {following.error}")
        new_turn = following.prompt
        images = images + following.images
    elif task in QUESTION_SETS:
        new_turn = user_turn(QUESTION_SETS[task].to_text(questions[first.row % len(questions)]))
    else:
        new_turn = user_turn(FIXED_INSTRUCTIONS[task])
    return continue_conversation(first.prompt, answer, new_turn), images


def build_followup(previous_samples: Sequence[Sample], previous_outputs: Mapping[str, str],
                   turn: str) -> list[Sample]:
    """Samples of the follow-up `turn` (FOLLOWUP_TURNS), each continuing a sample of the turn
    before it with the target's answer (`previous_outputs`, by sample id) and the row's next
    question of its own. A row with fewer questions has no sample of `turn`; a failed or
    unanswered previous turn gives a sample whose `error` says so."""
    if turn not in FOLLOWUP_TURNS:
        raise ValueError(f"unknown follow-up turn {turn!r}; known: {', '.join(FOLLOWUP_TURNS)}")
    before = previous_turn(turn)
    if any(s.turn != before for s in previous_samples):
        raise ValueError(f"{turn} continues {before!r} samples; got turns "
                         f"{sorted({s.turn for s in previous_samples})}")
    result = []
    for previous in (s for s in previous_samples if s.has_turn(turn)):
        sample = dataclasses.replace(previous, turn=turn, prompt="", images=(), error=None, answer=None)
        try:
            prompt = _followup_prompt(previous, previous_outputs, turn)
        except PromptError as exc:
            result.append(dataclasses.replace(sample, error=f"sample {sample.sample_id}: {exc}"))
            continue
        result.append(dataclasses.replace(sample, prompt=prompt, images=previous.images))
    return result


def _followup_prompt(previous: Sample, previous_outputs: Mapping[str, str], turn: str) -> str:
    if previous.error:
        raise PromptError(f"the {previous.turn} turn failed: {previous.error}")
    answer = previous_outputs.get(previous.sample_id)
    if answer is None:
        raise PromptError(f"no {previous.turn}-turn output for {previous.sample_id}")
    question = previous.followups[turn_index(turn) - 1]
    return continue_conversation(previous.prompt, answer, user_turn(question))
