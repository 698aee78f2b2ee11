"""Model names the grid accepts that need resolving on the node that loads them.

`tiny:<name>` is a tiny random LLaVA built by `pipeline.models.tiny` into a per-node cache
directory. The build is seeded, so every node builds identical weights and no file has to be
shipped to workers; a lock keeps concurrent actors on one node from building twice.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from pathlib import Path

from pipeline.models.head_names import head_kind
from pipeline.models.lookup_names import MIX, mixed_parts
from pipeline.planning.grid import TINY_PREFIX

TINY_DIR_ENV = "TABED_TINY_DIR"


def tiny_dir() -> Path:
    """The cache directory, named after the builder's source so a changed builder never
    reuses models an older one built."""
    import pipeline.models.tiny as builder
    import pipeline.models.tiny_common as common
    import pipeline.models.tiny_families as families_builder
    import pipeline.models.tiny_heads as heads_builder
    import pipeline.models.tiny_ssm as ssm_builder

    modules = (builder, common, ssm_builder, families_builder, heads_builder)
    sources = b"".join(Path(module.__file__).read_bytes() for module in modules)
    version = hashlib.sha256(sources).hexdigest()[:10]
    default = Path.home() / ".cache" / "tabed" / f"tiny-{version}"
    return Path(os.environ.get(TINY_DIR_ENV, default))


def ensure_tiny_models(root: Path | None = None) -> Path:
    """Build the tiny models under `root` unless a complete build is already there."""
    from pipeline.models.tiny import build_tiny_pair

    root = root or tiny_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "complete").exists():
            staging = root.parent / f".{root.name}.building"
            shutil.rmtree(staging, ignore_errors=True)
            build_tiny_pair(staging)
            (staging / "complete").touch()
            shutil.rmtree(root, ignore_errors=True)
            os.replace(staging, root)
    return root


def resolve_model(name: str) -> str:
    """What `load_model` should load for a grid model name (a tiny head: `<kind>:<its folder>`)."""
    if (parts := mixed_parts(name)) is not None:  # a draft model beside a lookup
        return f"{resolve_model(parts[0])}{MIX}{parts[1]}"
    if name.startswith(TINY_PREFIX):
        folder = str(ensure_tiny_models() / name[len(TINY_PREFIX):])
        kind = head_kind(name)
        return folder if kind is None else f"{kind}:{folder}"
    return name
