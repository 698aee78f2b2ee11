"""Our tau beside the TABED paper's published tables, on rows faked for the paper's own hub ids
(no download): the stored cells are the paper's, and cells pool as the paper's do."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.reports.paper_check import paper_check, paper_tables

TARGET, DRAFT = "llava-hf/llava-1.5-7b-hf", "mjbooo/lvlm68m"


def row(dataset: str, turn: str, method: str, accepted: list[int], *, target=TARGET, draft=DRAFT, gamma=5) -> dict:
    return {"target": target, "draft": draft, "dataset": dataset, "turn": turn, "method_label": method, "gamma": gamma,
            "temperature": 0.0, "verify": "chain", "error": None, "accepted_per_block": accepted,
            "blocks": len(accepted)}


def test_the_stored_tables_are_the_papers():
    paper = paper_tables()
    assert len(paper) == 880 and set(paper["table"]) == {1, 10, 11, 12, 13, 14}
    cell = lambda table, dataset, turn, method: paper[(paper["table"] == table) & (paper["dataset"] == dataset)
                                                      & (paper["turn"] == turn) & (paper["method"] == method)]["tau"].item()
    # the averages quoted with Table 1 (68M -> LLaVA-1.5 7B), and cells of the other tables
    assert [cell(10, "Avg.", "first", m) for m in ("M", "T", "MT*", "MTCP*")] == [2.24, 2.23, 2.31, 2.32]
    assert [cell(1, "Avg.", "second", m) for m in ("M", "T", "MT*")] == [2.00, 2.28, 2.27]
    assert cell(10, "pororo_sv", "first", "M") == 1.19 and cell(14, "*", "gsm8k", "MTCP*") == 2.22
    assert cell(12, "pope", "first", "M") == 3.06 and cell(13, "vist", "first", "T") == 1.86


def test_a_run_of_the_papers_pair_is_put_beside_its_cells():
    rows = pd.DataFrame([
        row("pope", "first", "M", [2, 2, 1]),                 # tau 2 + 2/3
        row("pope", "qaorg", "M", [1, 1]), row("pope", "summary", "M", [3, 3]),  # the paper's second turn: 3.0
        row("pope", "gsm8k", "T", [1]), row("docvqa", "gsm8k", "T", [3]),        # GSM8K over datasets: 3.0
        row("pope", "first", "M", [5], gamma=3),              # another gamma: not compared
        row("vist", "first", "M", [0], target="mine/llava", draft="mine/draft"),
    ])
    both, missing = paper_check(rows)
    assert missing == [("mine/llava", "mine/draft")]
    cells = both.set_index(["dataset", "turn", "method"])
    pope = cells.loc[("pope", "first", "M")]
    assert pope["table"] == 10 and pope["paper"] == 2.56 and pope["ours"] == pytest.approx(2 + 2 / 3)
    assert pope["difference"] == pytest.approx(2 + 2 / 3 - 2.56)
    assert cells.loc[("pope", "second", "M"), "ours"] == pytest.approx(3.0)
    assert cells.loc[("pope", "second", "M"), "paper"] == 2.78
    assert cells.loc[("*", "gsm8k", "T"), "ours"] == pytest.approx(3.0) and cells.loc[("*", "gsm8k", "T"), "paper"] == 2.30
    assert cells.loc[("Avg.", "first", "M"), "ours"] == pytest.approx(2 + 2 / 3)  # the one benchmark cell run


def test_a_pair_the_paper_did_not_publish_is_said_so():
    both, missing = paper_check(pd.DataFrame([row("pope", "first", "M", [1], target="embedded:target",
                                                  draft="embedded:small_draft")]))
    assert both.empty and missing == [("embedded:target", "embedded:small_draft")]
