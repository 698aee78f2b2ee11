"""Images held encoded by the driver and named safely: a sample keeps its image's file bytes (not
its pixels) with the prompt hash of before, and every form a cell can name an image in (a path
string, a pathlib.Path, a datasets Image struct with a path or bytes) obeys one folder check."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipeline.data import load_samples
from pipeline.data.images import to_rgb
from pipeline.data.prompts import PromptError
from pipeline.data.registry import user_dataset_spec
from pipeline.data.sample import Sample
from pipeline.data.user_datasets import MappedColumns, UserDataset


def pictures() -> dict[str, Image.Image]:
    """Three PNGs whose prompt hashes are pinned: plain RGB, 16-bit grey (rescaled), RGBA (composited)."""
    ramp = np.add.outer(np.arange(48), np.arange(64) * 3).astype(np.uint8)
    clear = Image.new("RGBA", (20, 10), (10, 20, 30, 0))
    clear.putpixel((3, 3), (200, 100, 50, 128))
    return {"rgb.png": Image.fromarray(np.stack([ramp, ramp[::-1], 255 - ramp], -1)),
            "deep.png": Image.fromarray((np.arange(32 * 40).reshape(32, 40) * 50).astype(np.uint16)),
            "clear.png": clear}


def user_rows(folder: Path, cells: list, file: str = "rows.jsonl") -> list[Sample]:
    """The samples of a JSONL user dataset in `folder` whose `image` column holds `cells`."""
    folder.mkdir(exist_ok=True)
    lines = [json.dumps({"question": "What is it?", "image": cell}) for cell in cells]
    (folder / file).write_text("\n".join(lines) + "\n")
    return load_samples(user_dataset_spec(UserDataset("mine", str(folder / file))), limit=len(cells))


def test_prompt_hashes_are_those_of_before_images_were_held_encoded(tmp_path):
    """Result rows are keyed by prompt_hash: these values were computed by the code that held
    decoded pixels, so runs written by it resume."""
    for name, picture in pictures().items():
        picture.save(tmp_path / name)
    samples = user_rows(tmp_path, list(pictures()))
    assert [(s.prompt_hash, s.image_hash, s.image_conversions) for s in samples] == [
        ("ca4dfd208a0b598d", "e895e37e00c1ccc0", ()),
        ("e01dd8a6d5e807cd", "6027b0e5a446193c", ("image 0: scaled-to-8-bit",)),
        ("878fd2b839456bb9", "b4fe9abdf1ee5a1e", ("image 0: alpha-on-white",)),
    ]
    assert [s.prompt_hash for s in load_samples("embedded_vqa", limit=2)] == ["d15e93147e46dc39",
                                                                              "5e3456864d68ece0"]
    deep = samples[1].pixels()[0]  # what a worker decodes: the pixels the hash was taken of
    assert deep.tobytes() == to_rgb(pictures()["deep.png"])[0].tobytes()


def test_the_driver_holds_a_sample_at_its_encoded_size_not_its_pixels(tmp_path):
    """A 1000x800 photo-like PNG: a sample (as held and as Ray ships it) weighs about its file,
    not width x height x 3."""
    rng = np.random.default_rng(0)
    smooth = np.add.outer(np.arange(800) // 4, np.arange(1000) // 4).astype(np.uint8)
    photo = np.stack([smooth + rng.integers(0, 4, smooth.shape, dtype=np.uint8)] * 3, -1)
    tmp_path.mkdir(exist_ok=True)
    Image.fromarray(photo).save(tmp_path / "photo.png")
    encoded = (tmp_path / "photo.png").stat().st_size
    sample, = user_rows(tmp_path, ["photo.png"])
    assert sample.error is None and len(sample.images[0].data) == encoded
    assert encoded < 1000 * 800 * 3 / 2
    assert len(pickle.dumps(sample)) < encoded + 4096


@pytest.mark.parametrize("form", [lambda outside: "../outside.png", lambda outside: outside,
                                  lambda outside: {"path": outside},
                                  lambda outside: {"path": "../outside.png", "bytes": None},
                                  lambda outside: {"path": "/etc/passwd"}])
def test_every_form_of_a_path_outside_the_dataset_folder_is_refused(tmp_path, form):
    Image.new("RGB", (4, 4), "red").save(tmp_path / "outside.png")
    cell = form(str(tmp_path / "outside.png"))
    sample, = user_rows(tmp_path / "data", [cell])
    assert "column 'image': image path" in sample.error and "leaves the dataset folder" in sample.error
    assert sample.images == ()


@pytest.mark.parametrize("cell", ["inside.png", {"path": "inside.png"},
                                  {"path": "inside.png", "bytes": None}])
def test_every_form_of_a_path_inside_the_dataset_folder_loads(tmp_path, cell):
    (tmp_path / "data").mkdir()
    Image.new("RGB", (4, 4), (0, 200, 0)).save(tmp_path / "data" / "inside.png")
    sample, = user_rows(tmp_path / "data", [cell])
    assert sample.error is None and sample.pixels()[0].getpixel((0, 0)) == (0, 200, 0)


def test_a_pathlib_path_obeys_the_same_check(tmp_path):
    (tmp_path / "data").mkdir()
    Image.new("RGB", (4, 4), "red").save(tmp_path / "outside.png")
    columns = MappedColumns(image_root=str(tmp_path / "data"))
    with pytest.raises(PromptError, match="leaves the dataset folder"):
        columns({"question": "q?", "image": tmp_path / "outside.png"})
    allowed = MappedColumns(image_root=str(tmp_path / "data"), allow_outside_paths=True)
    assert allowed({"question": "q?", "image": tmp_path / "outside.png"})[1] == [tmp_path / "outside.png"]


def test_struct_bytes_that_are_text_are_an_input_error_naming_the_column(tmp_path):
    sample, = user_rows(tmp_path, [{"bytes": "not an image", "path": None}])
    assert "column 'image': the image's bytes are a str, not bytes" in sample.error


def test_parquet_image_structs_decode_bytes_and_confine_paths(tmp_path):
    """The datasets Image struct as Parquet holds it: bytes decode (their path is only a name),
    a path without bytes is checked like any other, a broken file is that sample's error."""
    folder = tmp_path / "data"
    folder.mkdir()
    Image.new("RGB", (4, 4), (0, 0, 250)).save(folder / "inside.png")
    Image.new("RGB", (4, 4), "red").save(tmp_path / "outside.png")
    good = (folder / "inside.png").read_bytes()
    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(folder / "noise.png")
    broken = (folder / "noise.png").read_bytes()[:4000]
    cells = [{"bytes": good, "path": "/etc/passwd"}, {"bytes": None, "path": "inside.png"},
             {"bytes": None, "path": str(tmp_path / "outside.png")}, {"bytes": broken, "path": None}]
    pq.write_table(pa.table({"question": ["q?"] * 4, "image": cells}), folder / "rows.parquet")
    samples = load_samples(user_dataset_spec(UserDataset("mine", str(folder / "rows.parquet"))), limit=4)
    assert [s.pixels()[0].getpixel((0, 0)) for s in samples[:2]] == [(0, 0, 250)] * 2
    assert "leaves the dataset folder" in samples[2].error
    assert "image 0 cannot be read" in samples[3].error and samples[3].images == ()
