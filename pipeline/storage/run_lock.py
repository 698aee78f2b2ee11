"""One driver per run directory: two drivers writing one run would compute rows twice and
could keep both copies. The lock is written whole to a temporary file, then hard-linked into
place (exclusive and atomic on local and network file systems alike), so it never exists
half-written, even when the disk fills.

A lock left by a driver that died on this host is taken over, and so is an empty or unparsable
one (only a crash or an older version leaves one), without ever removing a lock to replace it:
locks are generations, `.lock` (as older versions wrote it), `.lock.1`, `.lock.2`, ..., the
highest one is the run's lock, and a driver takes a stale one over by linking the next
generation's name, which only one driver can create. Removing the stale lock first and then
linking one's own (as this once did) let two drivers that both read the stale lock both hold
the run: the second removed the first one's fresh lock.
"""
from __future__ import annotations

import errno
import json
import os
import re
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.storage.store import run_dir


_HELD: set[Path] = set()  # locks this process holds: taking one again nests
GENERATION = re.compile(r"\.lock(?:\.(\d+))?")  # `.lock` is generation 0


class RunLocked(RuntimeError):
    """Another driver holds the run."""


@contextmanager
def run_lock(out: str | Path, run: str) -> Iterator[Path]:
    """Hold the run's lock, `OUT/run=<run>/.lock` or a later generation (dot-prefixed: readers
    skip it), while the block runs. The job takes it before Ray starts and the runner again
    around its phases: nested, one lock."""
    folder = run_dir(out, run).resolve()
    held = next((path for path in _HELD if path.parent == folder), None)
    if held is not None:
        yield held
        return
    folder.mkdir(parents=True, exist_ok=True)
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    written = folder / f".lock.{os.getpid()}.tmp"
    try:
        with open(written, "w") as f:
            json.dump(holder, f)
            f.flush()
            os.fsync(f.fileno())
        while True:
            locks = generations(folder)
            if locks:
                top = max(locks)
                other = _live_holder(locks[top])
                if other is not None:
                    raise RunLocked(
                        f"run {run!r} in {out} is being written by pid {other.get('pid')} on "
                        f"{other.get('host')} since {other.get('since')}; wait for it to finish, or if "
                        f"that driver is gone, delete {locks[top]}")
            path = _generation_path(folder, max(locks) + 1 if locks else 0)
            if _linked(written, path):
                break  # else another driver linked that generation first: look again
    finally:
        written.unlink(missing_ok=True)
    for stale in locks.values():  # the generations this one took over
        stale.unlink(missing_ok=True)
    _HELD.add(path)
    try:
        yield path
    finally:
        _HELD.discard(path)
        path.unlink(missing_ok=True)


def generations(folder: Path) -> dict[int, Path]:
    """The run's lock files by generation."""
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except FileNotFoundError:
        return {}
    return {int(m.group(1) or 0): folder / name for name in names if (m := GENERATION.fullmatch(name))}


def _generation_path(folder: Path, generation: int) -> Path:
    return folder / (".lock" if generation == 0 else f".lock.{generation}")


def lock_holder(out: str | Path, run: str) -> dict | None:
    """Which other driver holds the run ({host, pid, since}), or None when none does: no lock,
    this process's own, a lock of a driver that died on this host, or an empty or unparsable file."""
    locks = generations(run_dir(out, run))
    if not locks or locks[max(locks)].resolve() in _HELD:
        return None
    return _live_holder(locks[max(locks)])


def _live_holder(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # gone since, or never a live lock: a lock is linked into place whole
    if not isinstance(holder, dict) or _died_here(holder):
        return None
    return holder


def _linked(written: Path, path: Path) -> bool:
    """Put the finished lock file in place unless one is there."""
    try:
        os.link(written, path)
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        try:  # a file system without hard links (some FUSE and SMB mounts): create exclusively, then fill
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(written.read_bytes())
    return True


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
