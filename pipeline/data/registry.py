"""The scenario registry: one entry per dataset the grid can name (paper Appendix I/J).

Each `DatasetSpec` says where the rows come from (a public `datasets` source, or rows built
offline from a package), which rows form the subset (the first `default_limit` of the split,
after the Interleave-Bench `sub_task` filter), how a row becomes a prompt, and the paper's
category. Loading lives in `pipeline.data.loading`; this module is pure description.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pipeline.data.embedded import scenarios
from pipeline.data.prompts import REASONING_INSTRUCTION, PromptError, image_question, user_turn
from pipeline.data.user_datasets import MappedColumns, UserDataset, confined_image

IMAGE_COLUMN = re.compile(r"image_(\d+)")


def _text(row: Mapping[str, Any], column: str) -> str:
    value = row.get(column)
    if value is None:
        raise PromptError(f"column {column!r} is missing or empty")
    if not isinstance(value, str):
        raise PromptError(f"column {column!r} holds {type(value).__name__}, not text")
    return value


@dataclass(frozen=True)
class SingleImage:
    """Rows with one `image` and a `question`; the image comes first in the prompt."""

    instruction: str | None = None
    columns: tuple[str, ...] = ("question", "image")

    def __call__(self, row: Mapping[str, Any]) -> tuple[str, list[Any]]:
        return image_question(_text(row, "question"), self.instruction), [row.get("image")]


@dataclass(frozen=True)
class Interleaved:
    """LLaVA-NeXT-Interleave-Bench rows: `question` already holds one `<image>` per image, and
    the images sit in `image_0`, `image_1`, ... (None past the row's last image). The reference
    sends the question verbatim as the user text; Appendix I shows what those questions read."""

    columns: tuple[str, ...] = ("question",)

    def __call__(self, row: Mapping[str, Any]) -> tuple[str, list[Any]]:
        numbered = sorted(
            (int(m.group(1)), column) for column in row if (m := IMAGE_COLUMN.fullmatch(column))
        )
        images = [row[column] for _, column in numbered if row[column] is not None]
        return user_turn(_text(row, "question")), images


@dataclass(frozen=True)
class Prebuilt:
    """Embedded rows that carry their user text (with placeholders) in `text` and image files in `images`."""

    columns: tuple[str, ...] = ("text", "images")

    def __call__(self, row: Mapping[str, Any]) -> tuple[str, list[Any]]:
        return user_turn(_text(row, "text")), list(row["images"])


@dataclass(frozen=True)
class ImageTurns:
    """MMSpec rows: `image` names a file in the local copy's `images/` folder (it must stay
    inside), `turns` lists the user's questions. The image and the first question open the
    conversation; the later questions are the dataset's own follow-up turns."""

    image_root: str = "images"  # relative to the local copy until `within` places it
    columns: tuple[str, ...] = ("turns", "image")

    def within(self, folder: str | Path) -> "ImageTurns":
        """This format reading its images from the local copy `folder`."""
        return dataclasses.replace(self, image_root=str(Path(folder, self.image_root).resolve()))

    def __call__(self, row: Mapping[str, Any]) -> tuple[str, list[Any]]:
        image = row.get("image")
        if not isinstance(image, str) or not image:
            raise PromptError("column 'image' names no image file")
        return image_question(self.questions(row)[0]), [confined_image(image, self.image_root, "image")]

    @staticmethod
    def questions(row: Mapping[str, Any]) -> tuple[str, ...]:
        """The row's questions in order; PromptError unless a non-empty list of texts."""
        turns = row.get("turns")
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
            raise PromptError(f"column 'turns' must be a non-empty list of questions, got {turns!r}")
        return tuple(turns)


RowFormat = SingleImage | Interleaved | Prebuilt | MappedColumns | ImageTurns


@dataclass(frozen=True)
class DatasetSpec:
    """Everything needed to turn one scenario into first-turn Samples.

    `split` is the public split and is what sample ids carry, whichever copy (hub or local)
    the rows came from, so results of both key alike. Exactly one of `hub_id`,
    `embedded_rows`, `path` (a user's own file, `pipeline.data.user_datasets`) and `local_file`
    (a dataset on no hub we can load, read from the local copy the grid's `sources` names) is set.
    """

    name: str
    title: str  # the paper's column name
    category: str  # "benchmark" or "ood" (paper Table 1)
    split: str
    format_row: RowFormat
    default_limit: int = 100
    hub_id: str | None = None
    config: str | None = None
    sub_task: str | None = None  # keep the rows whose `sub_task_column` holds this value
    sub_task_column: str = "sub_task"
    embedded_rows: Callable[[], Iterable[Mapping[str, Any]]] | None = None
    path: str | None = None
    answer_column: str | None = None  # kept as each sample's reference answer
    local_file: str | None = None  # the rows' file inside the local copy (MMSpec: mmspec.jsonl)
    source_name: str | None = None  # the `sources` entry it reads, when not its own name
    id_column: str | None = None  # the dataset's own row id, kept as each sample's `source_id`

    @property
    def required_columns(self) -> tuple[str, ...]:
        own = self.format_row.columns + ((self.answer_column,) if self.answer_column else ())
        return own + ((self.sub_task_column,) if self.sub_task else ())

    @property
    def source_key(self) -> str:
        """The grid's `sources` entry that names this dataset's local copy."""
        return self.source_name or self.name

    @property
    def own_turns(self) -> bool:
        """True when rows carry their own follow-up questions (`Sample.followups`)."""
        return isinstance(self.format_row, ImageTurns)

    @property
    def embedded(self) -> bool:
        """True when the rows ship with the project and need no network."""
        return self.embedded_rows is not None


INTERLEAVE_BENCH = "lmms-lab/LLaVA-NeXT-Interleave-Bench"


def _interleave(name: str, title: str, sub_task: str, category: str) -> DatasetSpec:
    return DatasetSpec(
        name, title, category, "test", Interleaved(),
        hub_id=INTERLEAVE_BENCH, config="in_domain", sub_task=sub_task,
    )


_SPECS = (
    # LLaVA-Bench: the paper's Appendix I shows the reasoning instruction, but the authors'
    # reference implementation sends the bare question, which produced their numbers.
    DatasetSpec("llava_bench", "LLaVA-W", "benchmark", "train", SingleImage(), default_limit=60,
                hub_id="lmms-lab/llava-bench-in-the-wild"),
    DatasetSpec("docvqa", "DocVQA", "benchmark", "lite", SingleImage(REASONING_INSTRUCTION),
                hub_id="lmms-lab/LMMs-Eval-Lite", config="docvqa_val"),
    DatasetSpec("pope", "POPE", "benchmark", "test", SingleImage(REASONING_INSTRUCTION),
                hub_id="lmms-lab/POPE"),
    DatasetSpec("mmvet", "MMVet", "benchmark", "test", SingleImage(REASONING_INSTRUCTION),
                hub_id="lmms-lab/MMVet"),
    _interleave("iedit", "IEdit", "IEdit", "benchmark"),
    _interleave("magicbrush", "MB", "MagicBrush", "benchmark"),
    _interleave("spot_the_diff", "Spot", "Spot-the-Diff", "benchmark"),
    _interleave("pororo_sv", "PSV", "PororoSV", "ood"),
    _interleave("vist", "VIST", "VIST", "ood"),
    # Offline scenarios on easy-VQA test images (pipeline/data/embedded/README.md).
    DatasetSpec("embedded_vqa", "easyVQA-QA", "benchmark", "test", SingleImage(REASONING_INSTRUCTION),
                embedded_rows=scenarios.vqa_rows),
    DatasetSpec("embedded_describe", "easyVQA-Describe", "benchmark", "test", Prebuilt(),
                embedded_rows=scenarios.describe_rows),
    DatasetSpec("embedded_compare", "easyVQA-Compare", "benchmark", "test", Prebuilt(),
                embedded_rows=scenarios.compare_rows),
    DatasetSpec("embedded_story", "easyVQA-Story", "ood", "test", Prebuilt(),
                embedded_rows=scenarios.story_rows),
    DatasetSpec("embedded_gallery", "easyVQA-Gallery", "ood", "test", Prebuilt(),
                embedded_rows=scenarios.gallery_rows),
    DatasetSpec("embedded_quote", "easyVQA-Quote", "benchmark", "test", Prebuilt(),
                embedded_rows=scenarios.quote_rows),
)

# MMSpec (github.com/fanyunfeng-bit/MMSpec-fyf): a split is a folder of mmspec.jsonl and images/;
# 600 rows, 100 per topic, some of 2-4 turns. It is on no hub we can load: read from `sources.mmspec`.
MMSPEC_FILE = "mmspec.jsonl"
MMSPEC_TOPICS = {
    "general_vqa": ("GVQA", "general vqa"),
    "text_vqa": ("TVQA", "text vqa"),
    "image_captioning": ("Cap", "image captioning"),
    "chart_understanding": ("Chart", "chart understanding"),
    "multi_turn": ("MT", "multi-turn conversation"),
    "complex_reasoning": ("CR", "complex reasoning pro"),
}


def _mmspec(suffix: str | None = None) -> DatasetSpec:
    short, topic = MMSPEC_TOPICS[suffix] if suffix else ("", None)
    return DatasetSpec(f"mmspec_{suffix}" if suffix else "mmspec", f"MMSpec-{short}" if short else "MMSpec",
                       "benchmark", "test", ImageTurns(), default_limit=100 if topic else 600,
                       sub_task=topic, sub_task_column="topic", local_file=MMSPEC_FILE,
                       source_name="mmspec", id_column="id")


_MMSPEC_SPECS = tuple(_mmspec(suffix) for suffix in (None, *MMSPEC_TOPICS))
DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in _SPECS + _MMSPEC_SPECS}


def get_dataset(name: str) -> DatasetSpec:
    """The spec registered under `name`; ValueError listing the known names otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}") from None


def source_key(name: str) -> str:
    """The grid's `sources` entry that names dataset `name`'s local copy (its own name unless
    the registry says otherwise: every mmspec_* dataset reads `mmspec`)."""
    return DATASETS[name].source_key if name in DATASETS else name


def is_embedded(name: str) -> bool:
    """True for a registered dataset that ships with the project (a user's file is not)."""
    return name in DATASETS and DATASETS[name].embedded


def user_dataset_spec(user: UserDataset) -> DatasetSpec:
    """The spec of a dataset a grid file names by path."""
    return DatasetSpec(user.name, user.name, user.category, user.split, user.columns,
                       path=user.path, answer_column=user.answer)
