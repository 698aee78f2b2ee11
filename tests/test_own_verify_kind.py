"""A verify kind of one's own is one module, no library file touched: a spec (its knobs and shape,
naming its proposer) and the proposer (how it drafts and replays). Named by import path in a grid
file, it runs through the whole job at batch 1 and 2: validated, keyed, decoded live, its live
rows replayed as a check, and every output the target's own; then `jobs/summarize.py` reports
the run in a fresh process that never imports the module, its knob in the speedup table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.draft import ChainProposer, StaticRule
from pipeline.decoding.proposals import Pending, Proposal
from pipeline.decoding.verify_kinds import VerifySpec
from tests.conftest import OWN_KIND, ROOT



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
def test_a_verify_kind_defined_in_one_module_runs_through_the_grid_and_its_report(batch_sweep_run):
    """The shared batch-sweep run (`tests/conftest.py`) verifies MT* by this kind, method 1, at
    batch 1 and 2 beside chains and candidate trees, live and calibrated."""
    import pandas as pd

    from pipeline.storage.store import read_results

    out, _, _ = batch_sweep_run
    rows = read_results(out, "sweep")
    own = rows[rows["verify_kind"] == OWN_KIND]
    single, batched = own[own["batch"] == 1], own[own["batch"] == 2]
    assert len(single) == len(batched) == 3 and own["error"].isna().all() and set(own["mode"]) == {"live"}
    ar = rows[(rows["mode"] == "ar") & (rows["batch"] == 1)].set_index("sample_id")["output_ids"].map(list)
    assert all(list(r.output_ids) == ar[r.sample_id] for r in own.itertuples())  # the target's own output
    # live rows are replayed as a check: the kind's replay rule gives live's accepted counts
    assert all(list(r.replay_accepted_per_block) == list(r.accepted_per_block) for r in single.itertuples())
    assert single["config_key"].nunique() == 1 and set(rows["config_key"]) > set(own["config_key"])
    label = f"{OWN_KIND}(method=1)"  # every knob in the label
    assert (own["verify"] == label).all() and json.loads(own["verify_knobs"].iloc[0]) == {"method": 1}

    # a fresh process that cannot import the kind's module still reports the run, costing its
    # blocks from the rows' columns and the run's calibration
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    summary = subprocess.run([sys.executable, "-c", "import sys; sys.modules['tests'] = None; "
                              "sys.argv = ['summarize', sys.argv[1]]; "
                              "import runpy; runpy.run_path('jobs/summarize.py', run_name='__main__')", str(out)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert summary.returncode == 0, summary.stderr[-3000:]
    speedup = pd.read_csv(out / "_report-sweep" / "speedup.csv")
    mine = speedup[speedup["method_label"] == f"MT* ({label})"]
    assert len(mine) == 1 and mine["corrected"].notna().all() and mine["eq1"].notna().all()
