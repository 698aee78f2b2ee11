"""Images as the models should see them: 8-bit RGB, upright, transparency on white.

Pillow's `convert("RGB")` alone clips 16-bit values (a 16-bit grayscale PNG turns white),
drops alpha onto black and ignores the EXIF orientation a camera wrote. `to_rgb` does each step
on purpose and says which it did, so a run can count its converted images.

Samples hold their images encoded (`EncodedImage`): a 12-megapixel photo is a few MB as its file
holds it and 36 MB as pixels, and the driver holds every sample of a run for the whole run.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps

BACKGROUND = (255, 255, 255)  # what transparent pixels are composited on
HIGH_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")

ROTATED, RESCALED, COMPOSITED = "exif-rotated", "scaled-to-8-bit", "alpha-on-white"
# Images above this many pixels are refused before they are decoded: a 30000x30000 PNG of a few
# kilobytes (a decompression bomb) would take gigabytes. 64 Mpx is twice a 8K frame; the grid
# field `max_image_pixels` raises it.
MAX_IMAGE_PIXELS = 64_000_000


@dataclass(frozen=True)
class EncodedImage:
    """One image as its file encodes it (PNG, JPEG, ...): what a Sample holds and Ray ships.
    `pixels` decodes it where it is used (a worker, or a hash) and the caller drops the pixels
    after; the same bytes always decode to the same pixels, so hashes and decoding agree."""

    data: bytes = field(repr=False)

    @classmethod
    def of(cls, image: Image.Image) -> "EncodedImage":
        """An in-memory picture (already upright) as lossless PNG: its `pixels` are `to_rgb(image)`'s."""
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)
        return cls(buffer.getvalue())

    def pixels(self) -> Image.Image:
        """The 8-bit RGB image the models see (`to_rgb` of the decoded file)."""
        with Image.open(io.BytesIO(self.data)) as opened:
            return to_rgb(opened)[0]


def pixel_budget_problem(size: tuple[int, int], budget: int) -> str | None:
    """Why an image of `size` (width, height) is refused, or None when it is within `budget`."""
    width, height = size
    if width * height <= budget:
        return None
    return (f"is {width}x{height} ({width * height / 1e6:,.0f} Mpx), above the pixel budget of "
            f"{budget / 1e6:,.0f} Mpx (grid field max_image_pixels)")


def to_rgb(image: Image.Image) -> tuple[Image.Image, tuple[str, ...]]:
    """The image as 8-bit RGB and the conversions that changed more than the pixel format."""
    notes = []
    if _orientation(image) not in (None, 1):
        notes.append(ROTATED)
    image = ImageOps.exif_transpose(image)
    if image.mode in HIGH_BIT_MODES:
        image = _to_8_bit(image)
        notes.append(RESCALED)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        if rgba.getextrema()[3][0] < 255:  # some pixel is not opaque
            notes.append(COMPOSITED)
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, BACKGROUND + (255,)), rgba)
    return image.convert("RGB"), tuple(notes)


def _orientation(image: Image.Image) -> int | None:
    try:
        return image.getexif().get(0x0112)  # EXIF Orientation
    except Exception:  # malformed EXIF blocks: treat as upright
        return None


def _to_8_bit(image: Image.Image) -> Image.Image:
    """Scale (not clip) a 16-bit or 32-bit single-channel image into 0..255. Integer data is
    taken as 16-bit (65535 = white) when it exceeds 255; float data as 0..1 when it fits."""
    values = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        top = 1.0 if values.max(initial=0.0) <= 1.0 else 65535.0
    else:
        top = 65535.0 if values.max(initial=0.0) > 255 else 255.0
    scaled = np.clip(np.round(values / top * 255.0), 0, 255).astype(np.uint8)
    return Image.fromarray(scaled, mode="L")
