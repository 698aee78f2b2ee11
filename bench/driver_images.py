"""What the driver keeps per sample of a user's dataset of large photos: 16 rows of 4000x3000
PNGs loaded as a run's driver loads them (`load_samples`), in a fresh process.

    python bench/driver_images.py [ROWS]     # about 20 s on 2 CPU cores

Prints `name=value` lines: the process's resident memory before and after loading (samples
still held; after, also before freed heap is handed back), what that adds per sample, and the
encoded size of one image beside its decoded pixels (width x height x 3). Measured on 2 cores:
before images were held encoded, 346 -> 1079 MB (45.8 MB a sample); after, 346 -> 520 MB
(10.9 MB a sample, the 11.4 MB file).
"""
from __future__ import annotations

import ctypes
import gc
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.data import load_samples  # noqa: E402
from pipeline.data.registry import user_dataset_spec  # noqa: E402
from pipeline.data.user_datasets import UserDataset  # noqa: E402

SIZE = (4000, 3000)


def rss_mb() -> float:
    """Resident memory of this process now, in MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def settled_rss_mb() -> float:
    """Resident memory after a collection and glibc's `malloc_trim`, which hands freed heap back:
    without it, pixels already freed can still count as resident."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


def photo() -> Image.Image:
    """A smooth picture with a little noise: compresses like a photo, not like pure noise."""
    rng = np.random.default_rng(0)
    x, y = np.meshgrid(np.linspace(0, 255, SIZE[0]), np.linspace(0, 255, SIZE[1]))
    noise = rng.integers(0, 8, (SIZE[1], SIZE[0]), dtype=np.uint8)
    return Image.fromarray(np.stack([c.astype(np.uint8) + noise for c in (x, y, (x + y) / 2)], -1))


def main(rows: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="driver-images-"))
    try:
        first = folder / "photo0.png"
        photo().save(first, compress_level=1)
        for k in range(1, rows):
            shutil.copyfile(first, folder / f"photo{k}.png")
        lines = [json.dumps({"question": "What is it?", "image": f"photo{k}.png"}) for k in range(rows)]
        (folder / "rows.jsonl").write_text("\n".join(lines) + "\n")
        spec = user_dataset_spec(UserDataset("photos", str(folder / "rows.jsonl")))
        load_samples(spec, limit=1)  # imports (datasets, torch) and caches, counted in neither figure
        before = settled_rss_mb()
        samples = load_samples(spec, limit=rows)
        untrimmed = rss_mb()
        after = settled_rss_mb()
        assert all(s.error is None for s in samples), [s.error for s in samples if s.error]
        print(f"rows={rows}")
        print(f"rss_before_mb={before:.0f}")
        print(f"rss_after_untrimmed_mb={untrimmed:.0f}")
        print(f"rss_after_mb={after:.0f}")
        print(f"added_per_sample_mb={(after - before) / rows:.1f}")
        print(f"encoded_image_mb={first.stat().st_size / 1e6:.1f}")
        print(f"decoded_image_mb={SIZE[0] * SIZE[1] * 3 / 1e6:.1f}")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
