"""Images decoded faithfully: 16-bit scaled (not clipped), transparency on white, EXIF
orientation applied, and each conversion recorded on the sample."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from pipeline.data.images import COMPOSITED, RESCALED, ROTATED, to_rgb
from pipeline.data.loading import load_image


def png_bytes(image: Image.Image, **save) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=save.pop("format", "PNG"), **save)
    return buffer.getvalue()


def test_a_16_bit_png_is_scaled_not_clipped_to_white():
    ramp = (np.arange(32 * 32).reshape(32, 32) * 64).astype(np.uint16)  # 0 .. 65472
    opened = Image.open(io.BytesIO(png_bytes(Image.fromarray(ramp))))
    assert np.asarray(opened.convert("RGB")).mean() > 240  # what Pillow alone does: clipped, nearly white
    image, notes = to_rgb(opened)
    pixels = np.asarray(image)
    assert notes == (RESCALED,) and image.mode == "RGB"
    assert pixels.min() == 0 and pixels.max() == 255 and abs(pixels.mean() - 127) < 1


def test_transparency_goes_on_white_and_opaque_alpha_is_not_reported():
    clear = Image.new("RGBA", (4, 4), (10, 20, 30, 0))
    image, notes = to_rgb(clear)
    assert notes == (COMPOSITED,) and np.asarray(image)[0, 0].tolist() == [255, 255, 255]
    half = Image.new("RGBA", (4, 4), (0, 0, 0, 128))
    assert np.asarray(to_rgb(half)[0])[0, 0].tolist() == [127, 127, 127]
    opaque = Image.new("RGBA", (4, 4), (10, 20, 30, 255))
    image, notes = to_rgb(opaque)
    assert notes == () and np.asarray(image)[0, 0].tolist() == [10, 20, 30]


def test_exif_orientation_is_applied():
    photo = Image.new("RGB", (30, 10), "red")
    exif = photo.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to view"
    image, notes = to_rgb(Image.open(io.BytesIO(png_bytes(photo, format="JPEG", exif=exif.tobytes()))))
    assert notes == (ROTATED,) and image.size == (10, 30)


def test_plain_rgb_is_untouched_and_rows_record_conversions():
    rgb = Image.new("RGB", (5, 5), (1, 2, 3))
    image, notes = load_image({"bytes": png_bytes(rgb)}, 0)
    assert notes == () and np.array_equal(np.asarray(image.pixels()), np.asarray(rgb))
    from pipeline.data.registry import get_dataset
    from pipeline.data.loading import row_to_sample

    spec = get_dataset("docvqa")
    clear = Image.new("RGBA", (6, 6), (0, 0, 0, 0))
    sample = row_to_sample(spec, 0, {"question": "What is written?", "image": {"bytes": png_bytes(clear)}})
    assert sample.error is None and sample.image_conversions == (f"image 0: {COMPOSITED}",)
