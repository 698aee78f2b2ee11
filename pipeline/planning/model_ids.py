"""Model names a grid may use, checked without loading anything: hub ids, local directories
(whose config.json says the model class), `tiny:` and `embedded:` models.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pipeline.planning.grid import TINY_PREFIX, GridError

TINY_MODELS = ("target", "draft", "next_target")
EMBEDDED_MODELS = ("embedded:target", "embedded:draft")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# Hub ids whose model class is LLaVA-NeXT, recognised without downloading their config.
NEXT_HUB_NAME = re.compile(r"llava-v1\.6|llava-next|llava_next", re.IGNORECASE)


def model_kind(name: str) -> str:
    """`llava_next` when the model is known to be LLaVA-NeXT without loading it, else `other`."""
    if name == f"{TINY_PREFIX}next_target" or NEXT_HUB_NAME.search(name):
        return "llava_next"
    config = Path(name) / "config.json"
    if config.is_file():
        try:
            return json.loads(config.read_text()).get("model_type", "other")
        except (OSError, ValueError):
            return "other"
    return "other"


def check_model_id(name: Any, where: str) -> str:
    """A model is a hub id `org/name`, an existing local directory, `embedded:target|draft`
    or `tiny:target|draft|next_target`."""
    if not isinstance(name, str) or not name:
        raise GridError(f"{where}: a model must be a non-empty string, got {name!r}")
    if name.startswith("embedded:"):
        if name not in EMBEDDED_MODELS:
            raise GridError(f"{where}: unknown embedded model {name!r}; known: {list(EMBEDDED_MODELS)}")
        return name
    if name.startswith(TINY_PREFIX):
        if name[len(TINY_PREFIX):] not in TINY_MODELS:
            raise GridError(f"{where}: unknown tiny model {name!r}; known: {[TINY_PREFIX + m for m in TINY_MODELS]}")
        return name
    if Path(name).expanduser().is_dir():
        return name
    looks_local = name.startswith(("/", ".", "~")) or name.count("/") != 1
    if looks_local or not HUB_ID.fullmatch(name):
        raise GridError(
            f"{where}: {name!r} is neither an existing local directory nor a hub id 'org/name' "
            "(nor embedded:target|draft, tiny:target|draft|next_target)"
        )
    return name
