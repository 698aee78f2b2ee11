"""How the job ends where the driver cannot go on: SIGTERM wherever it arrives, a disk that
turns read-only mid-run, and the Ray token it leaves behind."""
from __future__ import annotations

import errno
import os
import stat
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
