"""One driver per run directory: two drivers writing one run would compute rows twice and
could keep both copies. The lock is written whole to a temporary file, then hard-linked into
place (exclusive and atomic on local and network file systems alike), so it never exists
half-written, even when the disk fills. A lock left by a driver that died on this host is
taken over, and so is an empty or unparsable one (only a crash or an older version leaves one).
"""
from __future__ import annotations

import errno
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.storage.store import run_dir


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
    written = path.with_name(f".lock.{os.getpid()}.tmp")
    try:
        with open(written, "w") as f:
            json.dump(holder, f)
            f.flush()
            os.fsync(f.fileno())
        while not _linked(written, path):
            other = lock_holder(out, run)
            if other is not None:
                raise RunLocked(
                    f"run {run!r} in {out} is being written by pid {other.get('pid')} on {other.get('host')} "
                    f"since {other.get('since')}; wait for it to finish, or if that driver is gone, "
                    f"delete {path}"
                )
            path.unlink(missing_ok=True)  # its driver is dead, or it is no lock at all: take the run over
    finally:
        written.unlink(missing_ok=True)
    _HELD.add(path)
    try:
        yield path
    finally:
        _HELD.discard(path)
        path.unlink(missing_ok=True)


def lock_holder(out: str | Path, run: str) -> dict | None:
    """Which other driver holds the run ({host, pid, since}), or None when none does: no lock,
    this process's own, a lock of a driver that died on this host, or an empty or unparsable file."""
    path = run_dir(out, run) / ".lock"
    if path.resolve() in _HELD:
        return None
    try:
        holder = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # never a live lock: a lock is linked into place whole
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
