"""Table-1 aggregation: tau pooled over blocks, errors left out, Avg. over benchmark datasets."""
from __future__ import annotations

import pandas as pd
import pytest

import jobs.summarize as summarize
from pipeline.decoding.config import DecodeConfig
from pipeline.data.sample import Sample
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.decoding.records import SampleRecord
from pipeline.planning.grid import Pair, RunConfig
from pipeline.reports.marks import HIGHER_EVERYWHERE
from pipeline.reports.report import AVERAGE, markdown_table, tau_table
from pipeline.storage.schema import make_row
from pipeline.storage.store import read_results, rows_to_table, write_shard
from tests.results_fixture import calibrations_of

PAIR = Pair("tiny:target", "tiny:draft")


def rows(config, dataset, category, accepted, error_row=None):
    out = []
    for i, blocks in enumerate(accepted):
        blocks = [0] * len(blocks) if config.decode.is_ar else blocks  # AR: one token per block
        sample = Sample(dataset, "test", i, "first", "USER: hi ASSISTANT:", category=category)
        weights = [] if config.decode.is_ar else [[0.5, 0.5]] * len(blocks)
        rec = SampleRecord(sample.sample_id, mode="ar" if config.decode.is_ar else "live", accepted_per_block=blocks,
                           weights_per_block=weights,
                           output_ids=[1] * (len(blocks) + sum(blocks)), error="boom" if i == error_row else None)
        out.append(make_row("r", f"{dataset}-{config.key()}", config, sample, rec))
    return out


@pytest.fixture
def results_dir(tmp_path):
    mt = RunConfig(PAIR, DecodeConfig("MT"))
    mt_star = {w: RunConfig(PAIR, DecodeConfig("MT", GridSearchPolicy(window=w))) for w in (None, 4)}
    ar = RunConfig(PAIR, DecodeConfig("AR", gamma=None))
    for config, accepted in [(mt, [[5, 1], [0]]), (mt_star[None], [[2, 2], [4]]), (mt_star[4], [[3], [3]]),
                             (ar, [[0, 0], [0]])]:
        write_shard(tmp_path, rows_to_table(rows(config, "pope", "benchmark", accepted + [[5]], error_row=2)))
        write_shard(tmp_path, rows_to_table(rows(config, "mmvet", "benchmark", [[1]])))
        write_shard(tmp_path, rows_to_table(rows(config, "vist", "ood", [[0, 1]])))
    return tmp_path


def test_tau_is_pooled_over_blocks_without_error_rows(results_dir):
    table = tau_table(read_results(results_dir))
    assert list(table.columns) == ["mmvet", "pope", "vist", AVERAGE]
    labels = [(idx[4], idx[5]) for idx in table.index]  # window varies within MT*: it becomes a level
    assert labels == [("AR", "-"), ("MT", "-"), ("MT*", "-"), ("MT*", 4)]
    cell = table.xs("MT", level="method_label")
    assert cell["pope"].item() == pytest.approx(1 + 6 / 3)  # blocks [5, 1] and [0]; the error row is left out
    assert cell["vist"].item() == pytest.approx(1.5)
    assert cell[AVERAGE].item() == pytest.approx((3.0 + 2.0) / 2)  # benchmark datasets only
    assert table.xs("AR", level="method_label")[AVERAGE].item() == 1.0
    star_all = table.xs(("MT*", "-"), level=("method_label", "window"))
    assert star_all["pope"].item() == pytest.approx(1 + 8 / 3)


def test_summarize_writes_marked_tables_and_plots(results_dir, capsys):
    assert summarize.main([str(results_dir)]) == 0
    out = capsys.readouterr().out
    assert "Block efficiency tau" in out and "MT*" in out and "Failed samples" in out
    report = results_dir / "_report-r"
    for name in ("summary.md", "tau.csv", "categories.csv", "speedup.csv", "tau.png", "weights.png"):
        assert (report / name).stat().st_size > 0, name
    categories = pd.read_csv(report / "categories.csv", index_col=[0, 1, 2, 3, 4])
    # benchmark first turn = mean of the per-dataset pooled tau of pope and mmvet
    assert categories.loc[("tiny:target", "tiny:draft", "fp32", "MT", "static"), "Benchmark first"] == pytest.approx((3.0 + 2.0) / 2)
    assert categories.loc[("tiny:target", "tiny:draft", "fp32", "MT", "static"), "Ood first"] == pytest.approx(1.5)


def test_markdown_marks_best_bold_and_second_italic():
    table = pd.DataFrame(
        {"method_label": ["AR", "M", "T", "MT*"], "pope": [1.0, 2.5, 2.1, 2.6]}
    ).set_index("method_label")
    text = markdown_table(table, HIGHER_EVERYWHERE)
    assert "| MT* | **2.60** |" in text and "| M | *2.50* |" in text and "| T | 2.10 |" in text
    assert "| AR | 1.00 |" in text  # the baseline is never marked


CPU = {"device_name": "cpu: X (2 threads)", "steps": "uncompiled", "torch_version": "2.13", "transformers_version": "5.23"}


def test_speedup_uses_calibration_and_live_walltime():
    from pipeline.reports.speedup import speedup_table

    base = {"target": "t", "draft": "d", "dtype": "fp32", "turn": "first", "error": None, "new_tokens": 8, "gamma": 5.0, "blocks": 2,
            "policy": "static", "engine": "static", **CPU}
    df = pd.DataFrame([
        {**base, "method_label": "AR", "mode": "ar", "sample_id": "s0", "accepted_per_block": [0, 0], "time_total_s": 4.0,
         "gamma": None, "new_tokens": 6},
        {**base, "method_label": "AR", "mode": "ar", "sample_id": "s2", "accepted_per_block": [0, 0], "time_total_s": 1.0,
         "gamma": None, "new_tokens": 6},
        {**base, "method_label": "M", "mode": "live", "sample_id": "s0", "accepted_per_block": [3, 1], "time_total_s": 2.0,
         "new_tokens": 6},
        {**base, "method_label": "M", "mode": "live", "sample_id": "s2", "accepted_per_block": [3, 1], "time_total_s": 1.0,
         "new_tokens": 4},  # cut short: MMSpec's two speedups part from ours
        {**base, "method_label": "MT", "mode": "replay", "sample_id": "s1", "accepted_per_block": [2, 2], "time_total_s": 0.0,
         "new_tokens": 6},
    ])
    calibrations = calibrations_of([{"target": "t", "draft": "d", "dtype": "fp32", "gamma": 5, "ratio_draft_target": 0.1,
                                     "ratio_verify": 1.5, "target_token_s": 0.01,
                                     "draft_rows_token_s": [0.001, 0.0015, 0.002, 0.0025], "measured_at": ""}])
    table = speedup_table(df, calibrations)
    machine = "cpu: X (2 threads), uncompiled steps, torch 2.13, transformers 5.23"
    m = table.loc[("t", "d", "fp32", "static", machine, "M", "static", 5)]
    assert m["tau"] == pytest.approx(3.0)
    assert m["eq1"] == pytest.approx(3.0 / (5 * 0.1 + 1))
    assert m["corrected"] == pytest.approx(3.0 / (5 * 0.1 + 1.5))
    assert m["measured"] == pytest.approx((4.0 + 1.0) / (2.0 + 1.0))  # summed AR time over summed SD time
    assert m["paired"] == pytest.approx((6 / 2 / (6 / 4) + 4 / 1 / (6 / 1)) / 2)  # MMSpec: mean of tokens/s ratios
    assert m["global"] == pytest.approx((10 / 3) / (12 / 5))  # and summed tokens over summed time
    mt = table.loc[("t", "d", "fp32", "static", "-", "MT", "static", 5)]  # never timed: no machine
    assert mt["corrected"] == pytest.approx(3.0 / (5 * 0.15 + 1.5))  # a two-row draft batch
    assert pd.isna(mt["measured"])  # replayed rows carry no walltime
    assert table.loc[("t", "d", "fp32", "static", machine, "AR", "static", "-"), "measured"] == 1.0


def test_energy_columns_appear_only_where_a_gpu_counter_was_read():
    """J per new token and per accepted draft token beside the speedups; rows without energy
    (a CPU) leave the columns out rather than print zeros."""
    from pipeline.reports.speedup import speedup_table

    base = {"target": "t", "draft": "d", "dtype": "fp32", "turn": "first", "error": None, "new_tokens": 8, "gamma": 5.0,
            "policy": "static", "engine": "static", "sample_id": "s0", "new_tokens": 8, **CPU}
    df = pd.DataFrame([
        {**base, "method_label": "AR", "mode": "ar", "accepted_per_block": [0] * 8, "time_total_s": 4.0,
         "gamma": None, "blocks": 8, "energy_j": 16.0},
        {**base, "method_label": "M", "mode": "live", "accepted_per_block": [3, 1], "time_total_s": 2.0,
         "blocks": 2, "energy_j": 10.0},
    ])
    table = speedup_table(df, calibrations_of([]))
    m = table.xs("M", level="method_label").iloc[0]
    assert m["J/token"] == pytest.approx(10.0 / 8) and m["J/accepted"] == pytest.approx(10.0 / 4)
    ar = table.xs("AR", level="method_label").iloc[0]
    assert ar["J/token"] == pytest.approx(2.0) and pd.isna(ar["J/accepted"])
    assert "J/token" not in speedup_table(df.assign(energy_j=None), calibrations_of([])).columns


def test_a_grid_sweeping_gamma_gets_one_speedup_row_per_gamma():
    """tau, Eq. 1, the verify cost and the measured speedup of each gamma are its own."""
    from pipeline.reports.speedup import speedup_table

    base = {"target": "t", "draft": "d", "dtype": "fp32", "turn": "first", "error": None, "new_tokens": 8, "policy": "static",
            "engine": "static", "method_label": "M", "mode": "live", "sample_id": "s0", **CPU}
    df = pd.DataFrame([
        {**base, "method_label": "AR", "mode": "ar", "gamma": None, "accepted_per_block": [0] * 4, "blocks": 4,
         "time_total_s": 4.0},
        {**base, "gamma": 2.0, "accepted_per_block": [2, 2], "blocks": 2, "time_total_s": 1.0},  # tau 3
        {**base, "gamma": 5.0, "accepted_per_block": [5, 0], "blocks": 2, "time_total_s": 2.0},  # tau 3.5
    ])
    stored = {"target": "t", "draft": "d", "dtype": "fp32", "gamma": 5, "ratio_draft_target": 0.1,
              "ratio_verify": 1.6, "draft_rows_ratio": [0.1] * 4, "measured_at": "",
              "verify_tokens": [3, 6], "verify_ratios": [1.2, 1.6]}
    calibrations = calibrations_of([stored])
    table = speedup_table(df, calibrations).reset_index()
    sd = table[table["method_label"] == "M"].set_index("gamma")
    assert sorted(sd.index) == [2, 5]
    assert sd.loc[2, "tau"] == pytest.approx(3.0) and sd.loc[5, "tau"] == pytest.approx(3.5)
    assert sd.loc[2, "eq1"] == pytest.approx(3.0 / (2 * 0.1 + 1)) and sd.loc[5, "eq1"] == pytest.approx(3.5 / (5 * 0.1 + 1))
    assert sd.loc[2, "corrected"] == pytest.approx(3.0 / (2 * 0.1 + 1.2))  # gamma 2's own 3-token verify
    assert sd.loc[5, "corrected"] == pytest.approx(3.5 / (5 * 0.1 + 1.6))
    assert (sd.loc[2, "measured"], sd.loc[5, "measured"]) == pytest.approx((4.0, 2.0))
    # a gamma whose verify cost was not measured gets Eq. 1 but no corrected form
    no_curve = calibrations_of([{k: v for k, v in stored.items() if k not in ("verify_tokens", "verify_ratios")}])
    sd = speedup_table(df, no_curve).reset_index().query("method_label == 'M'").set_index("gamma")
    assert pd.isna(sd.loc[2, "corrected"]) and sd.loc[5, "corrected"] == pytest.approx(3.5 / (5 * 0.1 + 1.6))


def test_speedup_never_pools_walltimes_of_different_engines_dtypes_or_machines():
    from pipeline.reports.speedup import speedup_table

    base = {"target": "t", "draft": "d", "turn": "first", "error": None, "new_tokens": 8, "gamma": 5.0, "blocks": 2, "policy": "static",
            "accepted_per_block": [1, 1], "sample_id": "s0", **CPU}
    row = lambda engine, label, seconds, dtype="fp32", **where: {
        **base, "dtype": dtype, "engine": engine, "method_label": label, "time_total_s": seconds,
        "mode": "ar" if label == "AR" else "live", **where}
    gpu = {"device_name": "NVIDIA H100", "steps": "captured"}
    df = pd.DataFrame([row("static", "AR", 4.0), row("static", "M", 2.0), row("eager", "AR", 9.0),
                       row("eager", "M", 3.0), row(None, "AR", 5.0), row(None, "M", 5.0),
                       row("static", "AR", 8.0, "fp16"), row("static", "M", 2.0, "fp16"),
                       row("static", "AR", 1.0, **gpu), row("static", "M", 0.25, **gpu),
                       row("static", "M", 0.5, device_name="NVIDIA H100", steps="captured+uncompiled")])
    table = speedup_table(df, calibrations_of([]))
    measured = table["measured"].xs("M", level="method_label").droplevel(["target", "draft", "gamma", "policy"])
    cpu = "cpu: X (2 threads), uncompiled steps, torch 2.13, transformers 5.23"
    h100 = "NVIDIA H100, captured steps, torch 2.13, transformers 5.23"
    fallback = ("fp32", "static", "NVIDIA H100, captured+uncompiled steps, torch 2.13, transformers 5.23")
    assert pd.isna(measured.pop(fallback))  # a fallback's rows have no AR of their own kind to compare with
    # "-": rows from before engines were recorded
    assert measured.to_dict() == {("fp32", "-", cpu): 1.0, ("fp32", "eager", cpu): 3.0, ("fp32", "static", cpu): 2.0,
                                  ("fp16", "static", cpu): 4.0, ("fp32", "static", h100): 4.0}
    assert list(table.index.names) == ["target", "draft", "dtype", "engine", "timed_on", "method_label", "policy", "gamma"]


def test_rows_without_timing_columns_are_unrecorded_not_pooled_with_new_ones():
    from pipeline.reports.speedup import timing_label

    rows = pd.DataFrame([CPU, {"device_name": None, "steps": None, "torch_version": None, "transformers_version": None}])
    assert timing_label(rows).tolist() == ["cpu: X (2 threads), uncompiled steps, torch 2.13, transformers 5.23",
                                           "unrecorded"]
    assert timing_label(pd.DataFrame(index=[0])).tolist() == ["unrecorded"]


def test_draft_sizes_are_compared_side_by_side_per_target():
    from pipeline.reports.speedup import draft_size_table, speedup_table

    def rows(draft, accepted, sd_seconds):
        base = {"target": "t", "draft": draft, "dtype": "fp32", "turn": "first", "error": None, "new_tokens": 8, "gamma": 5.0,
                "blocks": 2, "engine": "static", "sample_id": "s0", **CPU}
        return [{**base, "method_label": "AR", "mode": "ar", "policy": "static", "accepted_per_block": [0, 0],
                 "time_total_s": 4.0, "gamma": None},
                {**base, "method_label": "M", "mode": "live", "policy": "static", "accepted_per_block": accepted,
                 "time_total_s": sd_seconds},
                {**base, "method_label": "MT*", "mode": "live", "policy": "grid(hard+soft)",
                 "accepted_per_block": accepted, "time_total_s": sd_seconds * 2}]

    calibration = lambda draft, ratio: {"target": "t", "draft": draft, "dtype": "fp32", "gamma": 5,
                                        "ratio_draft_target": ratio, "ratio_verify": 1.5, "target_token_s": 0.01,
                                        "measured_at": "", "draft_rows_ratio": [ratio] * 4}
    untimed = [{**row, "mode": "replay" if row["mode"] == "live" else row["mode"]} for row in rows("huge", [5, 5], 1.0)]
    df = pd.DataFrame(rows("large", [4, 4], 8.0) + rows("small", [2, 2], 2.0) + untimed
                      + [{**row, "target": "alone"} for row in rows("d", [1, 1], 4.0)])  # one draft: not compared
    calibrations = calibrations_of([calibration("large", 1.0), calibration("small", 0.1), calibration("huge", 2.0)])
    table = draft_size_table(speedup_table(df, calibrations), calibrations)
    machine = "cpu: X (2 threads), uncompiled steps, torch 2.13, transformers 5.23"
    block = ("t", "fp32", "static", 5, machine)
    assert list(table.index) == [block + ("small",), block + ("large",), block + ("huge",)]  # cheapest first
    assert list(table.columns) == ["Tq/Tp"] + [f"{c} {m}" for m in ("M", "MT*") for c in ("tau", "eq1", "measured")] + ["noise"]
    small = table.loc[block + ("small",)]
    assert (small["Tq/Tp"], small["tau M"], small["measured M"], small["measured MT*"]) == pytest.approx((0.1, 3.0, 2.0, 1.0))
    assert small["eq1 M"] == pytest.approx(3.0 / (5 * 0.1 + 1))
    assert table.loc[block + ("large",), "measured M"] == pytest.approx(0.5)
    huge = table.loc[block + ("huge",)]  # replayed only: its tau and Eq. 1 beside the timed drafts
    assert huge["tau M"] == pytest.approx(6.0) and pd.isna(huge["measured M"])
    assert draft_size_table(speedup_table(df[df["target"] == "alone"], calibrations), calibrations).empty


def test_findings_say_where_m_beats_t_and_where_mt_star_lands(tmp_path):
    from pipeline.reports.report import findings_text, method_findings

    configs = {
        "M": RunConfig(PAIR, DecodeConfig("M")), "T": RunConfig(PAIR, DecodeConfig("T")), "MT": RunConfig(PAIR, DecodeConfig("MT")),
        "MT*": RunConfig(PAIR, DecodeConfig("MT", GridSearchPolicy())), "MT* inv": RunConfig(PAIR, DecodeConfig("MT", InverseErrorPolicy())),
    }
    accepted = {  # one sample, one block each: tau = 1 + accepted
        "pope": {"M": 3, "T": 1, "MT": 2, "MT*": 4, "MT* inv": 0},
        "vist": {"M": 0, "T": 2, "MT": 2, "MT*": 1, "MT* inv": 3},
    }
    for dataset, by_config in accepted.items():
        for name, a in by_config.items():
            write_shard(tmp_path, rows_to_table(rows(configs[name], dataset, "benchmark", [[a]])))
    findings = method_findings(read_results(tmp_path))
    pope, vist = findings.xs("pope", level="dataset").iloc[0], findings.xs("vist", level="dataset").iloc[0]
    assert (pope["M"], pope["T"], pope["M vs T"]) == (4.0, 2.0, "M +2.00")
    assert vist["M vs T"] == "T +2.00"
    assert pope["MT*"] == "5.00 (rank 1/5)" and vist["MT*"] == "2.00 (rank 4/5)"  # grid policy only
    assert pope["best"] == "MT* grid(hard+soft) 5.00"  # MT* ran under two policies: named with its policy
    assert vist["best"] == "MT* inverse(T=1) 4.00"
    assert "MTCP*" not in findings  # not run: no column
    text = findings_text(findings)
    assert "- M beats T on: pope (first)." in text and "- T beats M on: vist (first)." in text
    assert "- MT* lands at: pope (first) 5.00 (rank 1/5), vist (first) 2.00 (rank 4/5)." in text


def test_markdown_marks_best_within_each_turn():
    table = pd.DataFrame({
        "turn": ["first"] * 3 + ["qaorg"] * 3, "method_label": ["M", "T", "MT*"] * 2,
        "pope": [2.5, 2.1, 2.6, 3.9, 4.2, 4.0],
    }).set_index(["turn", "method_label"])
    text = markdown_table(table, HIGHER_EVERYWHERE)
    assert "| first | MT* | **2.60** |" in text and "| first | M | *2.50* |" in text
    assert "| qaorg | T | **4.20** |" in text and "| qaorg | MT* | *4.00* |" in text and "| qaorg | M | 3.90 |" in text
