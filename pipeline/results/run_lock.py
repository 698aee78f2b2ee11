"""One driver per run directory: two drivers writing one run would compute rows twice and
could keep both copies. The lock is a file created exclusively (atomic on local and network
file systems alike); a lock left by a driver that died on this host is taken over.
"""
from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.results.store import run_dir


_HELD: set[Path] = set()  # locks this process holds: taking one again nests


class RunLocked(RuntimeError):
    """Another driver holds the run."""


@contextmanager
def run_lock(out: str | Path, run: str) -> Iterator[Path]:
    """Hold `OUT/run=<run>/.lock` (dot-prefixed: readers skip it) while the block runs. The
    job takes it before Ray starts and the runner again around its phases: nested, one lock."""
    path = (run_dir(out, run) / ".lock").resolve()
    if path in _HELD:
        yield path
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            other = _holder(path)
            if not _died_here(other):
                raise RunLocked(
                    f"run {run!r} in {out} is being written by pid {other.get('pid')} on {other.get('host')} "
                    f"since {other.get('since')}; wait for it to finish, or if that driver is gone, delete {path}"
                ) from None
            path.unlink(missing_ok=True)  # its driver is dead: take the run over
    with os.fdopen(fd, "w") as f:
        json.dump(holder, f)
    _HELD.add(path)
    try:
        yield path
    finally:
        _HELD.discard(path)
        path.unlink(missing_ok=True)


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # being written this instant, or unreadable: treat as held


def _died_here(holder: dict) -> bool:
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
