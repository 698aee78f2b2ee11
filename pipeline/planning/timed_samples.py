"""Which first-turn samples a pair decodes live for walltime (grid `live_samples`).

Walltime is measured on a handful of samples, so which ones matters: the first N rows of a
dataset often share one picture, and a "measured speedup" would then describe that picture.
The choice is dealt round-robin over the pair's datasets, seeded (`live_seed`), and prefers
images not chosen yet; samples that failed to load are never chosen.
"""
from __future__ import annotations

import random
from typing import Mapping, Sequence

from pipeline.data.sample import Sample


def image_identity(sample: Sample) -> str:
    """What the sample shows: its pixels' hash (a text-only prompt never repeats an image)."""
    return sample.image_hash if sample.images else f"text:{sample.sample_id}"


def choose_timed(samples_by_dataset: Mapping[str, Sequence[Sample]], count: int, seed: int) -> list[str]:
    """Up to `count` sample ids: one per dataset in turn (datasets in the given order), each
    the next in a seeded shuffle of that dataset whose image is not among those chosen, or
    the next one at all when every remaining image repeats."""
    orders = {}
    for dataset, samples in samples_by_dataset.items():
        usable = [s for s in samples if s.error is None]
        random.Random(f"{seed}/{dataset}").shuffle(usable)
        orders[dataset] = usable
    identity = {s.sample_id: image_identity(s) for order in orders.values() for s in order}
    chosen: list[str] = []
    seen_images: set[str] = set()
    while len(chosen) < count and any(orders.values()):
        for dataset, remaining in orders.items():
            if len(chosen) == count or not remaining:
                continue
            pick = next((s for s in remaining if identity[s.sample_id] not in seen_images), remaining[0])
            remaining.remove(pick)
            seen_images.add(identity[pick.sample_id])
            chosen.append(pick.sample_id)
    return chosen
