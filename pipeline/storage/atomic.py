"""Every file a run writes (shards, manifests, calibrations) written the same way:
a temporary file of a name no other writer uses, fsynced, renamed over the old one, the folder
fsynced, so a crash or a full disk leaves the old file or the new one, and two writers at once
each replace the file whole instead of failing on one shared temporary name."""
from __future__ import annotations

import errno
import logging
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

log = logging.getLogger(__name__)

# OSErrors that mean the disk will not take what a job writes, not that the job is wrong: the job
# says so in one line with what to do, instead of a traceback
UNWRITABLE = {errno.ENOSPC: "no space left on the disk", errno.EDQUOT: "the disk quota is used up",
              errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied"}


def write_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Fill `path` through `write(file)` so that it is never seen half-written."""
    with temporary(path) as tmp:
        fill(tmp, write)
        os.replace(tmp, path)
    fsync_folder(path.parent)


@contextmanager
def temporary(path: Path) -> Iterator[Path]:
    """A name for `path`'s temporary file: a dot file beside it (readers skip it) that no other
    writer uses. Whatever is left under it when the block ends is removed: a full disk or an
    interrupt leaves no stray temporary file (one renamed into place is gone already)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def fill(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write `path` through `write(file)` and flush it to disk (before it is renamed anywhere)."""
    with open(path, "wb") as sink:
        write(sink)
        sink.flush()
        os.fsync(sink.fileno())


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename itself is still atomic
    finally:
        os.close(fd)


def set_aside(path: Path, err: Exception, then: str) -> Path:
    """Rename an unreadable run file to `<name>.unreadable-<time>` beside it (kept for a look,
    never read again), warning with its name, why it could not be read (`err`) and what
    happens instead (`then`)."""
    aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}")
    os.replace(path, aside)
    why = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
    log.warning("%s is unreadable (%s); moved to %s; %s", path, why, aside.name, then)
    return aside
