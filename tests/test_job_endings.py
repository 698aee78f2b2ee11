"""How the job ends where the driver cannot go on: SIGTERM wherever it arrives, a disk that
turns read-only mid-run, and the Ray token it leaves behind."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import jobs.full_grid as full_grid


def test_sigterm_inside_rays_wait_still_ends_as_terminated(monkeypatch):
    monkeypatch.setattr(full_grid, "SIGTERM_RECEIVED", full_grid.threading.Event())
    assert full_grid.stopped_by(KeyboardInterrupt()) == ("interrupted", 130)  # Ctrl-C
    full_grid.SIGTERM_RECEIVED.set()  # the handler ran, but Ray's wait raised a plain KeyboardInterrupt
    assert full_grid.stopped_by(KeyboardInterrupt()) == ("terminated", 143)  # was 130 "interrupted"
    assert full_grid.stopped_by(full_grid.Terminated()) == ("terminated", 143)


def test_a_disk_turning_read_only_mid_run_ends_in_the_resume_line(tmp_path, monkeypatch, capsys):
    def read_only(*args):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "run=g" / "part-1.parquet"))

    monkeypatch.setattr(full_grid, "run_locked", read_only)
    args = SimpleNamespace(out=str(tmp_path), run="g")
    assert full_grid.run(SimpleNamespace(name="g"), args, source=None) == full_grid.EXIT_FAILED
    (line,) = capsys.readouterr().err.strip().splitlines()  # was a traceback
    assert "the file system is read-only" in line and "rerun the same command to resume" in line


def test_rays_token_is_left_readable_by_its_owner_only(tmp_path, monkeypatch):
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("secret")
    token.chmod(0o644)  # as Ray writes it, with the default umask
    monkeypatch.setattr(full_grid.Path, "home", lambda: tmp_path)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    full_grid.keep_token_private()
    assert stat.S_IMODE(os.stat(token).st_mode) == 0o600


def test_a_gcs_that_stops_answering_ends_the_job_with_the_resume_line(tmp_path):
    """Ray ends the driver from C++ 60 s after losing the GCS, where no Python runs: the watch
    says how to resume first (a port nobody listens on stands in for the dead GCS)."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    watch = (f"import time, jobs.full_grid as job\njob.GCS_SILENT_S = 0.5\nwatching = job.watch_gcs("
             f"lambda: 'rerun the same command to resume', '127.0.0.1:{port}', every_s=0.1)\n")
    root = Path(full_grid.__file__).resolve().parents[1]
    started = time.monotonic()
    ended = subprocess.run([sys.executable, "-c", watch + "time.sleep(30)"], capture_output=True, text=True,
                           timeout=60, cwd=root)
    assert ended.returncode == full_grid.EXIT_FAILED and time.monotonic() - started < 20
    (line,) = ended.stderr.strip().splitlines()
    assert f"GCS at 127.0.0.1:{port} stopped answering" in line and "rerun the same command" in line
    stopped = subprocess.run([sys.executable, "-c", watch + "watching.set()\ntime.sleep(2)"], timeout=60,
                             cwd=root)
    assert stopped.returncode == 0  # the job's own Ray shutting down after the run ends nothing
