"""Our block efficiency beside the TABED paper's published tables (`pipeline/assets/paper`).

A run's pair matches a published pair by hub ids. Cells line up as the paper pooled them:
a first-turn cell is one dataset's first turns; the paper's "second turn" of a benchmark
dataset pools that dataset's second turns of the instruction tasks (`qaorg`, `captioning`,
`summary`, `story`) the run has; its NQ and GSM8K columns pool the `nq` and `gsm8k` turns over
every dataset; `Avg.` is the mean of the benchmark datasets' cells. Only greedy chains at the
paper's gamma (5) are compared, and each of our configurations (dtype, policy, window, distance)
is a row of its own beside the paper's cell: none is pooled with another.
"""
from __future__ import annotations

from importlib import resources

import pandas as pd

from pipeline.reports.pooling import pooled_taus
from pipeline.reports.report import with_dashes

INSTRUCTION_TURNS = ("qaorg", "captioning", "summary", "story")
PAPER_GAMMA = 5
# what tells two of our cells of one paper cell apart
CONFIG = ["dtype", "policy", "window", "distance"]
COLUMNS = ["table", "target", "draft", *CONFIG, "dataset", "turn", "method", "paper", "ours", "difference"]
BENCHMARK = ("llava_bench", "docvqa", "pope", "mmvet", "iedit", "magicbrush", "spot_the_diff")


def paper_tables() -> pd.DataFrame:
    """Every published cell: table, target, draft, dataset, turn, method, tau."""
    with resources.files("pipeline.assets.paper").joinpath("tabed_block_efficiency.csv").open() as f:
        return pd.read_csv(f)


def _our_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """Pooled tau per pair, dataset, paper turn and method, as the paper's cells pool."""
    chains = rows[rows["error"].isna() & (rows["gamma"] == PAPER_GAMMA) & (rows["temperature"] == 0)
                  & (rows["verify"].astype("str").fillna("chain") == "chain")]
    if chains.empty:
        return pd.DataFrame(columns=["target", "draft", *CONFIG, "dataset", "turn", "method", "ours"])
    paper_turn = chains["turn"].map(lambda t: "second" if t in INSTRUCTION_TURNS else t)
    dataset = chains["dataset"].astype("str").where(~chains["turn"].isin(["nq", "gsm8k"]), "*")
    keyed = chains.assign(paper_turn=paper_turn, paper_dataset=dataset)
    keyed = keyed.assign(**{c: "-" for c in CONFIG if c not in keyed})  # rows made by hand may lack them
    keyed = with_dashes(keyed, CONFIG)
    keys = ["target", "draft", *CONFIG, "paper_dataset", "paper_turn", "method_label"]
    cells = pooled_taus(keyed, keys, sort=True).rename("ours").reset_index()
    cells = cells.rename(columns={"paper_dataset": "dataset", "paper_turn": "turn", "method_label": "method"})
    bench = cells[cells["dataset"].isin(BENCHMARK)]
    averages = (bench.groupby(["target", "draft", *CONFIG, "turn", "method"])["ours"].mean().reset_index()
                .assign(dataset="Avg."))
    return pd.concat([cells, averages], ignore_index=True)


def paper_check(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """(our cells beside the paper's with the difference, for pairs the paper published; the
    run's pairs it did not publish)."""
    # Table 1 repeats Table 10
    paper = (paper_tables().sort_values("table")
             .drop_duplicates(["target", "draft", "dataset", "turn", "method"], keep="last"))
    pairs = list(dict.fromkeys(zip(rows["target"], rows["draft"])))
    published = set(zip(paper["target"], paper["draft"]))
    missing = [pair for pair in pairs if pair not in published]
    ours = _our_cells(rows[[pair in published for pair in zip(rows["target"], rows["draft"])]])
    if ours.empty:
        return pd.DataFrame(columns=COLUMNS), missing
    both = paper.rename(columns={"tau": "paper"}).merge(
        ours, on=["target", "draft", "dataset", "turn", "method"])
    both["difference"] = both["ours"] - both["paper"]
    return both[COLUMNS], missing
