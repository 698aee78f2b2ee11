"""Files a run keeps besides its shards: written like shards (unique temporary names, fsync,
atomic rename) and, when found unreadable, set aside with their name in a warning and rebuilt,
instead of ending every report and rerun in a traceback."""
from __future__ import annotations

import logging
import threading

from pipeline.storage.calibration_store import calibration_path, read_calibrations, write_calibration
from tests.results_fixture import calibrations_of


def a_calibration(target: str = "t"):
    return calibrations_of([{"target": target, "draft": "d", "dtype": "fp32", "gamma": 5,
                             "ratio_draft_target": 0.1, "ratio_verify": 1.5, "measured_at": ""}]).all[0]


def test_a_truncated_calibration_is_set_aside_and_the_rest_read(tmp_path, caplog):
    write_calibration(tmp_path, a_calibration("t"))
    broken = write_calibration(tmp_path, a_calibration("u"))
    broken.write_bytes(broken.read_bytes()[:40])  # the disk filled, or a copy was cut short
    with caplog.at_level(logging.WARNING):
        found = read_calibrations(tmp_path)
    assert [c.target for c in found.all] == ["t"]  # was an ArrowInvalid traceback
    assert broken.name in caplog.text and "calibrated again" in caplog.text
    assert not broken.exists() and list(broken.parent.glob(f"{broken.name}.unreadable-*"))
    write_calibration(tmp_path, a_calibration("u"))  # the next calibration writes it again
    assert sorted(c.target for c in read_calibrations(tmp_path).all) == ["t", "u"]


def test_concurrent_calibration_writers_each_replace_the_file_whole(tmp_path):
    failures = []

    def write() -> None:
        for _ in range(20):
            try:
                write_calibration(tmp_path, a_calibration())
            except OSError as err:  # one shared temporary name: FileNotFoundError on the rename
                failures.append(err)

    writers = [threading.Thread(target=write) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert not failures
    assert len(read_calibrations(tmp_path).all) == 1
    assert calibration_path(tmp_path, "t", "d", "fp32").is_file()
    folder = calibration_path(tmp_path, "t", "d", "fp32").parent
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_an_empty_or_cut_manifest_is_set_aside_and_rewritten(tmp_path, caplog):
    from pipeline.storage.manifest import GridRecord, manifest_path, record_grid, run_grids

    path = manifest_path(tmp_path, "r")
    path.parent.mkdir(parents=True)
    for leftover in ("", '{"grids": [{"name": "g", "dig'):
        path.write_text(leftover)
        with caplog.at_level(logging.WARNING):
            assert run_grids(tmp_path, "r") == []  # was a JSONDecodeError ending summarize and the rerun
        assert path.name in caplog.text and not path.exists()
        grids = record_grid(tmp_path, "r", GridRecord("g", "abc", "now"))  # the rerun records its grid
        assert [g.name for g in grids] == ["g"] and run_grids(tmp_path, "r") == grids
    assert len(list(path.parent.glob(f"{path.name}.unreadable-*"))) == 2  # both kept for a look
