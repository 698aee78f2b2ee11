"""Acceptance in other tools' conventions, on hand-made rows whose answers are worked out here:
per-position acceptance (chains, candidate trees, a bandit's blocks of two depths, a last block
cut by EOS), tau0 = tau - 1 on every row, the acceptance rate and tau per request."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.decoding.config import DecodeConfig
from pipeline.reports.acceptance import acceptance_table, per_position_table
from pipeline.reports.requests import blocks_of, position_matrix

BANDIT_SHAPES = [[3, 3, 2, 1], [2, 2, 2, 1, 1, 1]]


def row(accepted, *, label="M", verify="chain", gamma=3, sample=0, shapes=None, chosen=None, turn="first") -> dict:
    return {"target": "t", "draft": "d", "dtype": "fp32", "turn": turn, "method_label": label, "verify": verify,
            "gamma": gamma, "accepted_per_block": accepted, "verify_shapes": shapes, "shape_per_block": chosen or [],
            "error": None, "sample_id": f"s/{sample}"}


def block_depths(one: dict) -> list[int]:
    """Drafted positions of each block of one row."""
    return blocks_of(pd.DataFrame([one]))[2].tolist()


def position_counts(one: dict):
    """(reached, accepted) per draft position of one row's blocks."""
    reached, hits = position_matrix(pd.DataFrame([one]))
    return reached[0], hits[0]


def test_a_chain_counts_each_position_reached_and_censors_the_last_block():
    # blocks of gamma 3 accepting 3, 1, 0, then a last block cut (EOS or budget) after 2
    reached, accepted = position_counts(row([3, 1, 0, 2]))
    assert reached.tolist() == [4, 3, 1] and accepted.tolist() == [3, 2, 1]
    table = per_position_table(pd.DataFrame([row([3, 1, 0, 2])]))
    assert table["acceptance"].tolist() == pytest.approx([3 / 4, 2 / 3, 1.0])


def test_a_last_block_cut_before_any_proposal_reaches_nothing():
    # 2 of 3 accepted, the third rejected; then a last block whose first token ended it (EOS)
    reached, accepted = position_counts(row([2, 0]))
    assert reached.tolist() == [1, 1, 1] and accepted.tolist() == [1, 1, 0]


def test_candidate_trees_and_bandit_blocks_use_each_blocks_depth():
    tree = row([1, 3, 0], label="MT*", verify="candidates")
    assert block_depths(tree) == [3, 3, 3]
    bandit = row([4, 2, 6, 1], label="MT*", verify="bandit(...)", gamma=6, shapes=BANDIT_SHAPES, chosen=[0, 1, 1, 0])
    assert block_depths(bandit) == [4, 6, 6, 4]
    reached, accepted = position_counts(bandit)
    # block 1: all 4 of depth 4 accepted; block 2: 2 of 6, the third rejected; block 3: all 6; block 4 (last): 1
    assert reached.tolist() == [4, 3, 3, 2, 1, 1] and accepted.tolist() == [4, 3, 2, 2, 1, 1]
    table = per_position_table(pd.DataFrame([tree, bandit]))
    assert set(table["method_label"]) == {"MT* (candidates)", "MT* (bandit(...))"}
    rate = acceptance_table(pd.DataFrame([bandit]))["acceptance_rate"].item()
    assert rate == pytest.approx(13 / 20)  # accepted drafts over drafted positions, 4 + 6 + 6 + 4


def test_per_request_acceptance_averages_the_requests_that_reached_a_position():
    rows = pd.DataFrame([row([3, 3, 3], sample=0), row([0, 0, 0, 1], sample=1)])
    first = per_position_table(rows).iloc[0]
    # pooled: position 1 accepted in 3 + 1 of 3 + 3 blocks reaching it... the last block of each is censored
    assert (first["reached"], first["accepted"]) == (3 + 4, 3 + 1)
    assert first["acceptance_per_request"] == pytest.approx((3 / 3 + 1 / 4) / 2)


def test_both_tau_conventions_and_the_spread_of_requests():
    rows = pd.DataFrame([row([3, 3, 3], sample=0), row([0, 0, 0, 1], sample=1)])
    table = acceptance_table(rows).iloc[0]
    assert table["tau"] == pytest.approx(1 + 10 / 7) and table["tau0"] == pytest.approx(10 / 7)
    assert table["acceptance_rate"] == pytest.approx(10 / 21)
    assert (table["tau_request_min"], table["tau_request_max"]) == pytest.approx((1.25, 4.0))
    assert table["tau_request_median"] == pytest.approx((1.25 + 4.0) / 2)


def test_tau0_is_tau_minus_one_on_every_row():
    from pipeline.data.sample import Sample
    from pipeline.planning.grid import Pair, RunConfig
    from pipeline.storage.schema import make_row
    from tests.test_results import record

    sample = Sample("toy", "test", 0, "first", "USER: q ASSISTANT:", ())
    for accepted in ([], [0], [3, 1, 0, 2], [5] * 7):
        rec = record(sample.sample_id, "answer", None)
        rec.accepted_per_block = list(accepted)
        made = make_row("r", "s", RunConfig(Pair("tiny:target", "tiny:draft"), DecodeConfig("M")), sample, rec)
        if made["tau"] is None:
            assert made["tau0"] is None
        else:
            assert made["tau0"] == made["tau"] - 1 and made["tau"] == 1 + sum(accepted) / len(accepted)


def test_the_per_position_legend_names_every_panels_methods():
    """One pair's panel may lack a method another's has: the legend holds both."""
    from pipeline.reports.acceptance_plots import per_position_figure

    rows = [("t", draft, "fp32", "first", label, position, 0.5)
            for draft, labels in (("small", ["M", "MT"]), ("small+pld", ["ML", "ML*"])) for label in labels
            for position in (1, 2)]
    table = pd.DataFrame(rows, columns=["target", "draft", "dtype", "turn", "method_label", "position",
                                        "acceptance"])
    fig, _ = per_position_figure(table)
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["M", "MT", "ML", "ML*"]
