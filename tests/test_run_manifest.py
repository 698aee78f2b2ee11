"""Extending a run with another grid is allowed, never silent: before Ray starts one line says
what the new grid adds and which stored configurations it leaves alone, the manifest keeps every
grid written into the run, and completeness is judged against the union of their rows."""
from __future__ import annotations

import yaml

import jobs.full_grid as full_grid
from pipeline.planning.grid_file import parse_grid
from pipeline.reports.completeness import completeness_table, completeness_text
from pipeline.storage.manifest import expected_rows, extension_text, grid_record, record_grid, run_grids, write_manifest

GRID = {"name": "sweep", "datasets": ["embedded_vqa"], "turns": ["first"], "limit": 2,
        "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}]}
SAMPLES = {"embedded_vqa": 2, "embedded_describe": 3}


def record(methods, datasets=("embedded_vqa",)):
    return grid_record(parse_grid({**GRID, "methods": methods, "datasets": list(datasets)}),
                       lambda unit: SAMPLES[unit.dataset])


def test_the_manifest_keeps_every_grid_and_expects_their_union(tmp_path):
    first, second = record(["AR", "M"]), record(["AR", "M", "T"], datasets=("embedded_vqa", "embedded_describe"))
    record_grid(tmp_path, "sweep", first)
    record_grid(tmp_path, "sweep", first)  # a rerun of the same grid is not a second grid
    grids = record_grid(tmp_path, "sweep", second)
    assert [g.digest for g in run_grids(tmp_path, "sweep")] == [first.digest, second.digest] == [g.digest for g in grids]
    # AR and M on vqa are in both grids: counted once; the second adds T on vqa and all three on describe
    assert expected_rows(grids) == [{"target": "tiny:target", "draft": "tiny:draft", "dtype": "fp32", "turn": "first",
                                      "rows": 3 * 2 + 3 * 3}]


def test_the_extension_line_names_what_is_added_and_what_is_left_alone(tmp_path):
    stored = [record(["AR", "M", "MT"])]
    line = extension_text("sweep", stored, set(), record(["AR", "M", "T"]))
    assert "already holds grid(s) sweep (6 rows)" in line
    assert "adds 1 configuration(s) (tiny:target <- tiny:draft (fp32) T static, gamma 5)" in line
    assert "leaves 1 stored configuration(s) alone (tiny:target <- tiny:draft (fp32) MT static, gamma 5)" in line
    assert extension_text("sweep", stored, set(), stored[0]) is None  # the same grid again: a plain resume
    assert extension_text("sweep", [], set(), stored[0]) is None  # a new run
    assert "rows from before manifests" in extension_text("sweep", [], {"0123456789abcdef"}, stored[0])


def test_the_job_says_so_before_ray_starts(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    record_grid(out, "sweep", record(["AR", "M"]))
    grid = tmp_path / "wider.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "methods": ["AR", "M", "T"]}))
    started = []
    monkeypatch.setattr(full_grid, "run", lambda spec, args, source: started.append(capsys.readouterr().out) or 0)
    assert full_grid.main(["--grid", str(grid), "--out", str(out)]) == 0
    assert started and "grid 'sweep' adds 1 configuration(s)" in started[0] and "leaves 0 stored" in started[0]


def test_completeness_compares_the_rows_present_with_every_grids_rows(tmp_path):
    """Rows of two grids in one run: against the last grid alone it read 'Complete' over more
    rows than expected; against the union it is complete, and says which grids it holds."""
    from pipeline.storage.store import read_results
    from pipeline.reports.summary import write_summary
    from tests.results_fixture import RUN, write_results

    out = write_results(tmp_path)
    rows = read_results(out, RUN)
    narrow = [{"target": "embedded:target", "draft": "embedded:draft", "dtype": "fp32", "turn": "first", "rows": 24}]
    text = completeness_text(completeness_table(rows, narrow), narrow)
    assert "belong to no grid recorded for this run" in text
    summary = write_summary(out, RUN, rows)
    assert "Complete: all 468 expected rows are present" in summary and "no grid recorded" not in summary
    write_manifest(out, RUN, {"grids": []})
    for name, group in (("chains", rows[rows["verify"].fillna("chain") == "chain"]), ("everything", rows)):
        units = tuple(u for u in _units(group))
        record_grid(out, RUN, type(record(["AR"]))(name, name, "2026-11-25 00:00:00", units))
    summary = write_summary(out, RUN, rows)
    assert "Complete: all 468 expected rows are present" in summary
    assert "union of the 2 grids written into this run: chains (" in summary and "everything (468 rows" in summary


def _units(rows):
    from pipeline.storage.manifest import Unit

    for (key, target, draft, dtype, turn, dataset), group in rows.groupby(
            ["config_key", "target", "draft", "dtype", "turn", "dataset"], observed=True):
        yield Unit(key, key, target, draft, dtype, turn, dataset, len(group))
