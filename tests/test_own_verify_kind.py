"""A verify kind of one's own is one module, no library file touched: a spec (its knobs and shape,
naming its proposer) and the proposer (how it drafts and replays). Named by import path in a grid
file, it runs through the whole job at batch 1 and 2: validated, keyed, decoded live on the
timed sample, replayed on the others, the live row's replay checked, and every output the
target's own; then `jobs/summarize.py` reports the run in a fresh process that never imports the
module, its knob in the speedup table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import ChainProposer, StaticRule
from pipeline.decoding.proposals import Pending, Proposal
from pipeline.decoding.verify_kinds import VerifySpec

ROOT = Path(__file__).resolve().parents[1]
KIND = "tests.test_own_verify_kind:OneMethodChain"  # as the job imports this module


@dataclass(frozen=True)
class OneMethodChain(VerifySpec):
    """A chain drafted by one drafting method alone (`method`: its place in the method set),
    whatever the ensemble weights say."""

    proposer: ClassVar[str] = "tests.test_own_verify_kind:OneMethodProposer"
    method: int = 0


class OneMethodProposer(ChainProposer):
    """The chain's proposer with all of each request's weight on one method."""

    def propose(self, pending: Pending, weights: torch.Tensor, budgets: list[int],
                uniforms: torch.Tensor | None) -> Proposal:
        alone = torch.zeros_like(weights)
        alone[:, self.config.verify.method] = 1
        return super().propose(pending, alone, budgets, uniforms)

    @classmethod
    def replay_rule(cls, config: DecodeConfig) -> StaticRule:
        def accepted(q: torch.Tensor, y: list[int], t: int, gamma: int, mixing: torch.Tensor) -> int:
            done, method = 0, config.verify.method
            while done < gamma and t + done < len(y) and int(q[t + done, method].argmax()) == y[t + done]:
                done += 1
            return done

        return StaticRule(config.gamma, accepted)


@pytest.mark.slow
def test_a_verify_kind_defined_in_one_module_runs_through_the_grid_and_its_report(tmp_path):
    import pandas as pd

    grid = {"name": "own", "datasets": ["embedded_vqa"], "turns": ["first"], "limit": 3, "shard_size": 3,
            "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}], "methods": ["AR", "MT"],
            "policies": [{"kind": "grid"}], "verify": ["chain", {"kind": KIND, "method": 1}], "gamma": [5],
            "batch": [1, 2], "max_new_tokens": 12, "mode": "auto", "live_samples": 1}
    path = tmp_path / "own.yaml"
    path.write_text(json.dumps(grid))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "jobs/full_grid.py", "--grid", str(path), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    from pipeline.results.store import read_results

    rows = read_results(out, "own")
    own = rows[rows["verify_kind"] == KIND]
    single, batched = own[own["batch"] == 1], own[own["batch"] == 2]
    assert len(single) == len(batched) == 3 and own["error"].isna().all()
    assert set(single["mode"]) == {"live", "replay"} and set(batched["mode"]) == {"live"}
    ar = rows[(rows["mode"] == "ar") & (rows["batch"] == 1)].set_index("sample_id")["output_ids"].map(list)
    assert all(list(r.output_ids) == ar[r.sample_id] for r in own.itertuples())  # the target's own output
    live = single[single["mode"] == "live"].iloc[0]
    assert list(live["replay_accepted_per_block"]) == list(live["accepted_per_block"])  # replay is live's
    assert single["config_key"].nunique() == 1 and set(rows["config_key"]) > set(own["config_key"])
    label = f"{KIND}(method=1)"  # every knob in the label
    assert (own["verify"] == label).all() and json.loads(own["verify_knobs"].iloc[0]) == {"method": 1}

    # a fresh process that cannot import the kind's module still reports the run, its blocks
    # costed from a calibration of the pair (made up here: the report is under test, not timing)
    from pipeline.planning.grid import Pair
    from pipeline.results.calibration_store import write_calibration
    from tests.results_fixture import calibration

    write_calibration(out, calibration(Pair("tiny:target", "tiny:draft"), 0.3))
    clean = {**env, "PYTHONPATH": str(ROOT / "pipeline" / "..")}
    summary = subprocess.run([sys.executable, "-c", "import sys; sys.modules['tests'] = None; "
                              "sys.argv = ['summarize', sys.argv[1]]; "
                              "import runpy; runpy.run_path('jobs/summarize.py', run_name='__main__')", str(out)],
                             cwd=ROOT, env=clean, capture_output=True, text=True, timeout=300)
    assert summary.returncode == 0, summary.stderr[-3000:]
    speedup = pd.read_csv(out / "_report-own" / "speedup.csv")
    mine = speedup[speedup["method_label"] == f"MT* ({label})"]
    assert len(mine) == 1 and mine["corrected"].notna().all() and mine["eq1"].notna().all()
