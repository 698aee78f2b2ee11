"""How large a grid and its numbers may be: every number has a stated range, the configurations
a grid names are counted before it is expanded, and a run's name must fit a folder name. A typo
(1e9 for 1e3) or a hostile file is refused in a line before it costs anything.
"""
from __future__ import annotations

import math
import re
from typing import Any

from pipeline.planning.grid import GridError
from pipeline.planning.grid_checks import AXES
from pipeline.planning.grid_values import shown

MAX_GAMMA = 64  # proposals per block: the paper uses 5; thousands only make every block slower
MAX_BATCH = 64  # requests decoded together
MAX_GPUS_PER_WORKER = 64  # GPUs one actor holds (a pair's `gpus:`): more than any node has
# Every number has a stated range: a typo (1e9 for 1e3) is refused before it costs anything.
MAX_SEED = 2**32 - 1
MAX_TEMPERATURE = 100.0  # past a few, sampling is uniform noise
MAX_NEW_TOKENS = 1 << 17  # the longest contexts; each target's own is checked before Ray
MAX_SAMPLES = 1_000_000  # limit, shard_size, live_samples
MAX_REPEATS = 1_000  # timed_repeats, calibrate_rounds, calibrate_repeats
MAX_IMAGE_PIXELS = 1 << 30
MAX_NAME = 100  # characters of a run name: it names a directory (255 bytes at most)
# Configurations before collapsing: the product of the lengths of pairs, methods, policies and
# the axes, refused before the grid is expanded (1e4 expand in about a second; the paper's grid
# has 2,160). A grid raises it with `max_configurations:`.
MAX_CONFIGURATIONS = 10_000
SIZED = ("pairs", "methods", "policies", *AXES)


def check_size(fields: dict[str, Any], bound: int) -> None:
    """Refuse a grid whose axes multiply past `bound` configurations, before expanding it (a 2 KB
    file can name millions: expanding them took minutes and gigabytes)."""
    lengths = {name: len(fields[name]) for name in SIZED}
    total = math.prod(lengths.values())
    if total > bound:
        factors = " x ".join(f"{n} {name}" for name, n in lengths.items() if n > 1)
        raise GridError(f"the grid names {total:,} configurations ({factors}); at most {bound:,}: shorten "
                        f"an axis, or raise the bound with the grid field max_configurations: {total}")


def check_name(value: Any, where: str = "name") -> str:
    """A run's name (the grid's `name`, or `--run`): it names folders under OUT, so no path,
    and at most `MAX_NAME` characters."""
    if not isinstance(value, str) or not re.fullmatch(r"[\w.\-]+", value) or set(value) == {"."}:
        raise GridError(f"{where} {shown(value)}: use letters, digits, '.', '_' or '-' "
                        "(it names a directory)")
    if len(value) > MAX_NAME:
        raise GridError(f"{where} {value[:20]!r}...: {len(value)} characters; at most {MAX_NAME} "
                        "(it names a directory)")
    return value
