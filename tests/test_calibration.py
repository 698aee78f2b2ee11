"""Calibration: the speedup formulas by hand, and a measurement that round-trips to disk."""
from __future__ import annotations

import math

import pytest

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.step_costs import calibrate
from pipeline.decoding.calibration import MAX_ROWS, Calibration, expected_speedup
from pipeline.storage.calibration_store import Calibrations, read_calibrations, write_calibration
from pipeline.decoding.engine import default_engine


def test_expected_speedup_equation_1_and_corrected_form():
    # paper Eq. 1 with the 7B/68M ratio 0.063 and tau 2.31 at gamma 5
    assert expected_speedup(2.31, 5, 0.063) == pytest.approx(2.31 / 1.315)
    # a verify forward costing 1.6 single steps (CPU) lowers the expectation
    assert expected_speedup(2.31, 5, 0.063, 1.6) == pytest.approx(2.31 / 1.915)


def test_calibration_measures_rounds_and_round_trips(tiny_pair, tmp_path):
    target, draft = tiny_pair
    result = calibrate(target, draft, gammas=(3,), repeats=3, rounds=3)
    assert result.target_token_s > 0 and result.target_verify_s > 0
    assert len(result.draft_rows_token_s) == MAX_ROWS and min(result.draft_rows_token_s) > 0
    assert result.rounds == 3 and len(result.ratio_draft_target_rounds) == 3 and len(result.ratio_verify_rounds) == 3
    rounds = sorted(result.ratio_draft_target_rounds)
    assert result.ratio_draft_target == pytest.approx(rounds[1])  # the median round, not one measurement
    assert len(result.draft_rows_ratio) == MAX_ROWS and result.measured_at
    # every round of every ratio is kept (noise is judged from them), and the load around them
    assert [len(r) for r in result.verify_ratio_rounds] == [3] and [len(r) for r in result.draft_rows_ratio_rounds] == [3] * 4
    assert result.draft_rows_ratio_rounds[0] == result.ratio_draft_target_rounds
    assert result.load_before is not None and result.load_after is not None and result.cpu_cores >= 1
    write_calibration(tmp_path, result)
    write_calibration(tmp_path, result)  # a re-run replaces, never duplicates
    table = read_calibrations(tmp_path)
    assert len(table.all) == 1
    assert table.all[0].ratio_verify == pytest.approx(result.ratio_verify)
    assert read_calibrations(tmp_path / "empty").empty
    assert table.all[0].verify_rounds(4) == pytest.approx(result.verify_ratio_rounds[0])
    shown = table.table().iloc[0]
    assert shown["Tq/Tp"] == f"{result.ratio_draft_target:.3f} [{rounds[0]:.3f}-{rounds[-1]:.3f}]"
    assert shown["rounds x repeats"] == "3 x 3" and shown["measured at"] == result.measured_at


def test_the_latest_calibration_of_a_pair_and_dtype_is_used():
    measured = lambda dtype, at, v: Calibration("t", "d", "cpu", dtype, 5, 0.01, 0.02, 0.001, [], v,
                                                measured_at=f"2026-01-0{at}T00:00:00+00:00")
    table = Calibrations([measured("fp32", 2, 2), measured("fp32", 1, 1), measured("fp16", 3, 3)])
    assert table.latest("t", "d", "fp32").repeats == 2
    assert table.latest("t", "d", "fp16").repeats == 3
    assert Calibrations([]).latest("t", "d", "fp32") is None


def test_the_verify_curve_gives_each_gamma_its_own_verify_cost(tiny_pair, tmp_path):
    """A grid sweeping gamma needs Tp(gamma+1)/Tp for each gamma, not the largest one's."""
    target, draft = tiny_pair
    result = calibrate(target, draft, gammas=(1, 3), repeats=2, rounds=2, verify_tokens=(9,))
    assert result.gamma == 3 and result.verify_tokens == [2, 4, 9] and len(result.verify_ratios) == 3
    write_calibration(tmp_path, result)
    stored = read_calibrations(tmp_path).all[0]
    assert set(stored.verify_tokens) == {2, 4, 9}
    assert [stored.verify_ratio(n) for n in (2, 4, 9)] == pytest.approx(result.verify_ratios)
    assert stored.verify_ratio(4) == pytest.approx(result.ratio_verify)  # gamma 3's verify is the headline one
    assert stored.verify_ratio(6) != stored.verify_ratio(6)  # NaN: gamma 5 was not measured
    assert "2: " in read_calibrations(tmp_path).table().iloc[0]["Tp(n)/Tp by n"]


def test_a_calibration_from_before_the_curve_knows_only_its_own_gamma():
    old = Calibration.from_row({"target": "t", "draft": "d", "device": "cpu", "dtype": "fp32", "gamma": 5,
                                "target_token_s": 0.01, "target_verify_s": 0.014, "draft_token_s": 0.001,
                                "draft_rows_token_s": [0.001], "repeats": 10, "ratio_verify": 1.4,
                                "verify_tokens": float("nan")})
    assert set(old.verify_tokens) == {6}
    assert old.verify_ratio(6) == pytest.approx(1.4) and old.verify_ratio(4) != old.verify_ratio(4)


@pytest.mark.parametrize("engine", ["static", "eager"])
def test_calibration_times_the_engine_it_names(tiny_pair, engine):
    target, draft = tiny_pair
    result = calibrate(target, draft, gammas=(3,), repeats=2, engine=engine)
    assert result.engine == engine and result.target_token_s > 0
    assert calibrate(target, draft, gammas=(3,), repeats=2).engine == default_engine(target, draft)


def test_the_calibrate_job_shows_its_rounds_and_rewrites_the_report_it_changes(tmp_path, capsys):
    import jobs.calibrate as job
    from pipeline.data.sample import Sample
    from pipeline.decoding.records import SampleRecord
    from pipeline.planning.grid import Pair, RunConfig
    from pipeline.storage.schema import make_row
    from pipeline.storage.store import read_results, rows_to_table, write_shard
    from pipeline.reports.summary import write_summary

    pair = Pair("tiny:target", "tiny:draft")
    sample = Sample("embedded_vqa", "test", 0, "first", "USER: <image>\nq ASSISTANT:", category="benchmark")
    rows = [make_row("r", "s", RunConfig(pair, DecodeConfig(m, gamma=None if m == "AR" else 3)), sample,
                     SampleRecord(sample.sample_id, mode="ar" if m == "AR" else "replay", accepted_per_block=[2, 1],
                                  output_ids=[5] * 5)) for m in ("AR", "M")]
    write_shard(tmp_path, rows_to_table(rows))
    report = tmp_path / "_report-r" / "summary.md"
    write_summary(tmp_path, "r", read_results(tmp_path, "r"))
    assert "## Calibration used" not in report.read_text()
    job.main(["--target", "tiny:target", "--draft", "tiny:draft", "--out", str(tmp_path), "--gamma", "3",
              "--rounds", "2", "--repeats", "2"])
    printed = capsys.readouterr().out
    for step in ("round 1/2: target step", "round 1/2: draft tiny:draft Tq/Tp", "round 2/2: draft tiny:draft"):
        assert step in printed, printed
    assert f"report rewritten with the new calibration: {report}" in printed
    assert "## Calibration used" in report.read_text() and "eq1" in (tmp_path / "_report-r" / "speedup.csv").read_text()


def test_calibration_times_a_step_after_prompts_of_several_lengths(tiny_pair, tmp_path):
    """How a draft's step grows with the context (the state-space draft's point); the report
    tabulates and draws it."""
    from pipeline.reports.plots import context_cost_figure

    target, draft = tiny_pair
    result = calibrate(target, draft, gammas=(3,), repeats=2, rounds=2, contexts=(16, 128, 10_000))
    assert result.context_tokens == [16, 128]  # 10000 does not fit the tiny models' 4096 positions
    assert len(result.context_target_s) == len(result.context_draft_s) == 2 and min(result.context_draft_s) > 0
    write_calibration(tmp_path, result)
    costs = read_calibrations(tmp_path).context_costs()
    assert list(costs["context"]) == [16, 128] and (costs["Tq/Tp"] > 0).all()
    assert context_cost_figure(costs) is not None


def test_calibration_times_the_same_steps_at_each_batch_size(tiny_pair, tmp_path):
    """The batch-aware Eq. 1 needs Tp, Tp(n) and Tq(m rows) with B requests in the batch."""
    target, draft = tiny_pair
    result = calibrate(target, draft, gammas=(3,), repeats=2, rounds=2, draft_rows=(6,), batches=(1, 2, 4))
    assert result.batch_sizes == [2, 4]  # batch 1 is the calibration's own fields
    assert [len(r) for r in result.batch_verify_ratios] == [1, 1] and min(min(result.batch_verify_ratios)) > 0
    assert [len(r) for r in result.batch_draft_ratios] == [5, 5]  # rows 1..4 and 6, each times the batch
    assert result.target_step_s(1) == result.target_token_s and result.target_step_s(4) > 0
    assert result.verify_ratio(4, batch=2) == result.batch_verify_ratios[0][0]
    assert result.draft_ratio(6, batch=4) == result.batch_draft_ratios[1][-1]
    assert result.verify_ratio(4, batch=1) == result.verify_ratios[0]
    assert all(map(math.isnan, (result.verify_ratio(4, batch=3), result.draft_ratio(6, batch=8),
                                result.target_step_s(3))))
    write_calibration(tmp_path, result)
    stored = read_calibrations(tmp_path).all[0]
    assert stored.batch_sizes == [2, 4] and stored.draft_ratio(6, batch=4) == pytest.approx(result.draft_ratio(6, 4))
    older = {k: v for k, v in result.to_row().items() if not k.startswith("batch_")}
    assert Calibration.from_row(older).batch_sizes == [] and math.isnan(Calibration.from_row(older).verify_ratio(4, 2))


def test_each_draft_is_timed_at_the_batches_it_steps(tiny_pair):
    """A grid's drafts need not step the same draft batches (a head drafting M alone never steps a
    candidate tree's 48 rows): each draft's calibration times its own, and the grid's plan says
    which are whose."""
    from actors.calibration import grid_shapes
    from pipeline.decoding.step_costs import calibrate_drafts
    from pipeline.planning.grid_file import parse_grid

    target, draft = tiny_pair
    first, second = calibrate_drafts(target, [draft, draft], gammas=(3,), repeats=1, rounds=1,
                                     rows_per_draft=[(6,), ()], draft_names=["a", "b"])
    assert first.draft_row_counts == [*range(1, MAX_ROWS + 1), 6] and second.draft_row_counts == [*range(1, MAX_ROWS + 1)]
    assert len(first.draft_rows_ratio) == MAX_ROWS + 1 and len(second.draft_rows_ratio) == MAX_ROWS
    spec = parse_grid({"datasets": ["embedded_vqa"], "methods": ["M", "MT"], "gamma": [3],
                       "verify": ["chain", {"kind": "candidates", "methods": ["MT"]}],
                       "pairs": [{"target": "tiny:target", "draft": "tiny:draft"},
                                 {"target": "tiny:bigram_target", "draft": "tiny:eagle_head"}]})
    shapes = grid_shapes(spec)
    assert max(shapes.rows_of("tiny:draft")) > max(shapes.rows_of("tiny:eagle_head")) == 1
    assert set(shapes.draft_rows) == set(shapes.rows_of("tiny:draft")) | set(shapes.rows_of("tiny:eagle_head"))
