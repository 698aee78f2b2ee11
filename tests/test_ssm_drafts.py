"""State-space (Mamba, Mamba2) drafts in the engine: greedy SD gives the target's own greedy output
for every method set, verify kind (chain, candidates, shape and bandit trees), gamma and engine,
in fp32 and fp16; trace replay gives live decoding's accepted counts, and a bandit's shapes,
exactly (fp64). The drafts
follow the bigram target about 73% of the time (`pipeline.models.tiny_ssm`), so blocks accept
none, some and all of their proposals; with the random tiny target they rarely agree."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.decoding.traces import collect_traces
from pipeline.decoding.replay import replay
from pipeline.planning.verify_entries import make_verify
from pipeline.drafting.policies import GridSearchPolicy
from pipeline.models.loading import load_model
from tests.conftest import FixedCaptioner, solid

MAX_NEW = 24
KINDS = ("mamba", "mamba2")
METHODS = {"M": DecodeConfig(methods="M"), "T": DecodeConfig(methods="T"), "MT": DecodeConfig(methods="MT"),
           "MT*": DecodeConfig(methods="MT", policy=GridSearchPolicy())}
VERIFY = ("chain", "candidates", "shape", "bandit")
SHAPES = {1: [3], 3: [3, 2, 1], 5: [2, 2, 2, 1, 1]}  # a shape tree's depth is its gamma


def verify_at(kind: str, gamma: int):
    """The verify spec of `kind` for a gamma (a shape of that depth; the bandit's default pool)."""
    entry = {"kind": kind, "shape": SHAPES[gamma]} if kind == "shape" else kind
    return make_verify(entry)


def sample(colour=(200, 30, 30), question="Describe the image.") -> Sample:
    return Sample("unit", "test", 0, "first", f"USER: <image>\n{question} ASSISTANT:", (solid(colour),))


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def models(request, tiny_dirs):
    dtype = request.param
    load = lambda name: load_model(tiny_dirs[name], dtype=dtype)
    return dtype, {"bigram_target": load("bigram_target"), "target": load("target"),
                   **{kind: load(f"{kind}_draft") for kind in KINDS}}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_sd_with_a_state_space_draft_is_the_targets_own_greedy_output(models, kind):
    """chain / candidates / shape / bandit x M, T, MT, MT* x both engines, on the bigram target at
    gamma 1/3/5 and on the random tiny LLaVA (fp32, where its drafts seldom agree) at gamma 3."""
    dtype, loaded = models
    draft, accepted = loaded[kind], []
    targets = ("bigram_target", "target") if dtype == "fp32" else ("bigram_target",)
    for target_name in targets:
        target = loaded[target_name]
        for engine in ("static", "eager"):
            reference = autoregressive_decode(target, [sample()], max_new_tokens=MAX_NEW, engine=engine)[0].output_ids
            for (name, config), verify in [(item, v) for item in METHODS.items() for v in VERIFY]:
                for gamma in (1, 3, 5) if target_name == "bigram_target" else (3,):
                    run = replace(config, gamma=gamma, max_new_tokens=MAX_NEW, verify=verify_at(verify, gamma))
                    record = speculative_decode(target, draft, [sample()], run, FixedCaptioner(), engine=engine)[0]
                    assert record.output_ids == reference, (dtype, kind, target_name, engine, name, verify, gamma)
                    if target_name == "bigram_target":
                        accepted += [(a, gamma) for a in record.accepted_per_block]
    # the blocks exercised every roll-back: nothing accepted, some, and a whole chain of 3 or 5
    assert any(a == 0 for a, _ in accepted) and any(0 < a < g for a, g in accepted)
    assert any(a == g >= 3 for a, g in accepted)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_replay_gives_live_accepted_counts_exactly_with_a_state_space_draft(tiny_dirs, kind):
    """fp64, where teacher-forced one-token steps and live decoding compute the same numbers."""
    target = load_model(tiny_dirs["bigram_target"])
    draft = load_model(tiny_dirs[f"{kind}_draft"])
    for model in (target, draft):
        model.model.double()
        model.dtype = torch.float64
    checked = 0
    for colour, question in (((200, 30, 30), "Describe the image."), ((20, 90, 210), "What is in this picture?")):
        case = sample(colour, question)
        traces = collect_traces(target, draft, case, "MT", FixedCaptioner(), max_new_tokens=MAX_NEW, engine="eager")
        for (name, config), verify in [(item, v) for item in METHODS.items() for v in VERIFY]:
            for gamma in (1, 5):
                run = replace(config, gamma=gamma, max_new_tokens=MAX_NEW, verify=verify_at(verify, gamma))
                live = speculative_decode(target, draft, [case], run, FixedCaptioner(), engine="eager")[0]
                replayed = replay(traces, run)
                assert replayed.accepted_per_block == live.accepted_per_block, (kind, name, verify, gamma)
                assert replayed.shape_per_block == live.shape_per_block, (kind, name, verify, gamma)
                assert replayed.weights_per_block == live.weights_per_block, (kind, name, verify, gamma)
                checked += 1
    assert checked == 2 * len(METHODS) * len(VERIFY) * 2


def test_a_state_space_draft_beside_compiled_steps_says_why_it_is_not_compiled(tiny_dirs, monkeypatch):
    """With compiling forced (as on a GPU), the target's steps compile and the state-space draft's
    cannot: its rows name that reason, so a `compiled+uncompiled` row never goes unexplained."""
    from pipeline.decoding.engine import COMPILE_ENV, STATE_SPACE_UNCOMPILED, new_rows

    draft = load_model(tiny_dirs["mamba2_draft"], dtype="fp32")
    prompt = [draft.embed_tokens(torch.tensor([1, 2, 3]))]
    for forced, expected in (("1", {STATE_SPACE_UNCOMPILED}), ("0", set())):
        monkeypatch.setenv(COMPILE_ENV, forced)
        rows = new_rows(draft, prompt, engine="static", capacity=8, role="draft")
        assert rows.step_log.fallbacks == expected
    assert not new_rows(draft, prompt, engine="eager", capacity=8, role="draft").step_log.fallbacks
