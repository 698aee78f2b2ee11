"""A verify kind of one's own is one module, no library file touched: a spec (its knobs and shape)
and the proposer registered under its kind (how it drafts and replays). Named by import path in
a grid file, it runs through the whole job: validated, keyed, decoded live on the timed sample,
replayed on the others, the live row's replay checked, and every output the target's own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pipeline.decoding.draft import ChainProposal, ChainProposer
from pipeline.decoding.acceptance import probabilities
from pipeline.decoding.verify_kinds import VerifySpec

ROOT = Path(__file__).resolve().parents[1]
KIND = "tests.test_own_verify_kind:FirstMethodChain"  # as the job imports this module


@dataclass(frozen=True)
class FirstMethodChain(VerifySpec):
    """A chain drafted by the first drafting method alone, whatever the ensemble weights say."""

    def key_fields(self) -> dict | None:
        return {"kind": self.kind}


class FirstMethodProposer(ChainProposer, kind=FirstMethodChain.kind):
    def propose(self, pending: torch.Tensor, weights: torch.Tensor, uniforms, keep_methods: bool) -> ChainProposal:
        logits = self.rows.feed(pending)[:, -1]
        proposals, methods = [], []
        for i in range(self.config.gamma):
            q = probabilities(logits, self.config.temperature)
            proposals.append(q[0].argmax(-1, keepdim=True))
            methods.append(q)
            if i < self.config.gamma - 1:
                logits = self.rows.feed(proposals[-1])[:, -1]
        return ChainProposal(torch.cat(proposals), None, torch.stack([m[0] for m in methods]), torch.stack(methods))

    @staticmethod
    def replay_accepted(q: torch.Tensor, y: list[int], t: int, gamma: int, mixing: torch.Tensor) -> int:
        accepted = 0
        while accepted < gamma and t + accepted < len(y) and int(q[t + accepted, 0].argmax()) == y[t + accepted]:
            accepted += 1
        return accepted


@pytest.mark.slow
def test_a_verify_kind_defined_in_one_module_runs_through_the_grid(tmp_path):
    import pandas as pd

    grid = {"name": "own", "datasets": ["embedded_vqa"], "turns": ["first"], "limit": 3, "shard_size": 3,
            "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}], "methods": ["AR", "MT"],
            "policies": [{"kind": "grid"}], "verify": ["chain", {"kind": KIND}], "gamma": [3],
            "max_new_tokens": 12, "mode": "auto", "live_samples": 1}
    path = tmp_path / "own.yaml"
    path.write_text(json.dumps(grid))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "jobs/full_grid.py", "--grid", str(path), "--out", str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    from pipeline.results.store import read_results

    rows = read_results(tmp_path / "out", "own")
    own = rows[rows["verify_kind"] == KIND]
    assert len(own) == 3 and set(own["mode"]) == {"live", "replay"} and own["error"].isna().all()
    ar = rows[rows["mode"] == "ar"].set_index("sample_id")["output_ids"].map(list)
    assert all(list(r.output_ids) == ar[r.sample_id] for r in own.itertuples())  # the target's own output
    live = own[own["mode"] == "live"].iloc[0]
    assert list(live["replay_accepted_per_block"]) == list(live["accepted_per_block"])  # replay is live's
    assert own["config_key"].nunique() == 1 and set(rows["config_key"]) > set(own["config_key"])
    assert pd.notna(own["verify"]).all() and (own["verify"] == KIND).all()
