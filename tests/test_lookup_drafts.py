"""Draft-free drafters (`pld`, `ngram`, `sam`) through the drafter seam: a pair names one as its
draft, greedy SD with it is the target's own greedy output for every verify kind, batch 1 and 3,
both engines; a block drafts the lookup's own continuation (transformers' candidates, for
`pld`); a request without a match drafts nothing and still decodes; sampling keeps the target's
distribution; a grid names them with their defaults or with hyperparameters."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import prefilled_rows
from pipeline.decoding.inputs import tokenize
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.decoding.step_costs import calibrate
from pipeline.lookups import new_lookup
from pipeline.models.loading import load_target_and_drafts
from pipeline.models.lookup_names import lookup_spec
from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import parse_grid
from pipeline.planning.verify_entries import make_verify
from tests.conftest import solid

MAX_NEW = 24
REPLAYED = ("pld", "ngram(prompt_lookup_min=1,prompt_lookup_max=3)", "sam(len_threshold=1)", "lookahead")
LOOKUPS = (*REPLAYED, "recycling")  # recycling learns from each block the target verified: live only
VERIFY = ("chain", "candidates", {"kind": "dynamic", "nodes": 8, "top_k": 3}, {"kind": "shape", "shape": [3, 2, 1]},
          "bandit", {"kind": "eagle2", "depth": 3, "top_k": 8, "total_tokens": 30})


def prompts(n: int) -> list[Sample]:
    """Requests of different lengths whose text repeats itself, so a lookup finds matches."""
    words = ["Describe the image. Describe the image in", "What colour is the shape? What colour is",
             "Read it: one two three four. Again: one two"]
    colours = [(200, 30, 30), (20, 90, 210), (30, 160, 60)]
    return [Sample("unit", "test", i, "first", f"USER: <image>\n{words[i % 3]} ASSISTANT:", (solid(colours[i % 3]),))
            for i in range(n)]


def lookup_pair(tiny_dirs, name: str):
    target, drafts = load_target_and_drafts(tiny_dirs["bigram_target"], {name: name})
    return target, drafts[name]


@pytest.fixture(scope="module", params=LOOKUPS)
def pair(request, tiny_dirs):
    return lookup_pair(tiny_dirs, request.param)


@pytest.fixture(scope="module", params=REPLAYED)
def replayed_pair(request, tiny_dirs):
    return lookup_pair(tiny_dirs, request.param)


def quoting(target, batch: list[Sample]) -> list[Sample]:
    """`batch`'s prompts, each quoting the start of the bigram target's answer to it: the target's
    next token depends on the last alone, so it answers the same, and a lookup finds it quoted."""
    answers = autoregressive_decode(target, batch, max_new_tokens=MAX_NEW // 2)
    return [replace(s, prompt=s.prompt.replace("USER: <image>\n", "USER: <image>\n"
                                                + target.tokenizer.decode(a.output_ids) + " "))
            for s, a in zip(batch, answers)]


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_greedy_sd_with_a_lookup_is_the_targets_own_greedy_output(pair, engine):
    """Every verify kind, gamma 1/3/5 on chains, batch 1 and 3; lookups propose, and blocks
    accept none and some."""
    target, lookup = pair
    cases = [("M", None, verify, gamma) for verify in VERIFY
             for gamma in ((1, 3, 5) if make_verify(verify).is_chain else (3,))]
    accepted = greedy_blocks(target, lookup, cases, engine)
    assert 0 in accepted and max(accepted) >= 2


def greedy_blocks(target, draft, cases, engine: str) -> list[int]:
    """Every case (methods, policy or None, verify, gamma) decodes the quoting prompts alone and as
    one batch to the target's own greedy output, with the same blocks; their accepted counts."""
    batch = quoting(target, prompts(3))
    reference = [r.output_ids for r in autoregressive_decode(target, batch, max_new_tokens=MAX_NEW, engine=engine)]
    accepted = []
    for methods, policy, verify, gamma in cases:
        spec = make_verify(verify)
        config = DecodeConfig(methods, gamma=gamma, max_new_tokens=MAX_NEW, verify=spec)
        config = replace(config, policy=policy or config.policy, verify=spec.settled(len(methods), gamma)[0],
                         gamma=spec.settled(len(methods), gamma)[1])
        alone = [speculative_decode(target, draft, [s], config, engine=engine)[0] for s in batch]
        together = speculative_decode(target, draft, batch, config, engine=engine)
        for one, many, ar in zip(alone, together, reference):
            assert one.output_ids == ar == many.output_ids, (methods, verify, gamma)
            assert one.accepted_per_block == many.accepted_per_block, (methods, verify, gamma)
            accepted += one.accepted_per_block
    return accepted


def test_replay_scores_a_lookups_chain_as_live_decodes_it(replayed_pair):
    from pipeline.decoding.replay import replay
    from pipeline.decoding.traces import collect_traces

    target, lookup = replayed_pair
    batch = quoting(target, prompts(3))
    traces = [collect_traces(target, lookup, s, "M", max_new_tokens=MAX_NEW) for s in batch]
    blocks = []
    # a ranking lookup (lookahead's trie) is replayed position by position, trees too
    kinds = [("chain", 1), ("chain", 3), ("chain", 5)] + [("bandit", 3)] * lookup.ranks
    for verify, gamma in kinds:
        config = DecodeConfig("M", gamma=gamma, max_new_tokens=MAX_NEW, verify=make_verify(verify))
        config = replace(config, gamma=config.verify.settled(1, gamma)[1])
        for live, trace in zip(speculative_decode(target, lookup, batch, config), traces):
            replayed = replay(trace, config)
            assert replayed.output_ids == live.output_ids and replayed.accepted_per_block == live.accepted_per_block
            blocks += live.accepted_per_block
    assert 0 in blocks and max(blocks) >= 3


def test_a_chain_drafts_the_lookups_own_continuation(tiny_dirs):
    """The first block's chain is transformers' prompt lookup candidates for the prompt, cut at
    gamma; a later token that leaves the plan looks up afresh."""
    target, drafts = load_target_and_drafts(tiny_dirs["target"], {"pld": "pld"})
    sample = Sample("unit", "test", 0, "first", "USER: <image>\nRead it: one two three four. Again: one two",
                    (solid((30, 160, 60)),))
    prompt = tokenize(target, sample)
    rows, _ = prefilled_rows(drafts["pld"], [prompt], "M", None, engine="eager", capacity=8, role="draft")
    reference = new_lookup("pld", lookup_spec("pld")[1])
    reference.extend([-1 if t == target.image_token_id else t for t in prompt.ids])  # the image: one id of its own
    plan = reference.propose()
    assert len(plan) >= 2, "the prompt repeats itself: prompt lookup finds a continuation"
    chain = [int(rows.feed([prompt.ids[-1]], valid=[1])[0, -1].argmax())]
    for _ in range(len(plan) - 1):
        chain.append(int(rows.feed([chain[-1]])[0, -1].argmax()))
    assert chain == plan
    assert bool(rows.feed([plan[0]]).isfinite().all()) == bool(rows.abstains.all())  # spent: uniform


def test_a_request_without_a_match_drafts_nothing_and_still_decodes(tiny_dirs):
    never = "sam(len_threshold=1000)"
    target, drafts = load_target_and_drafts(tiny_dirs["target"], {never: never})
    batch = prompts(3)
    reference = autoregressive_decode(target, batch, max_new_tokens=MAX_NEW)
    for record, ar in zip(speculative_decode(target, drafts[never], batch, DecodeConfig("M", gamma=4,
                                                                                       max_new_tokens=MAX_NEW)),
                          reference):
        assert record.output_ids == ar.output_ids
        assert set(record.accepted_per_block) == {0} and len(record.accepted_per_block) == len(ar.output_ids)


SAMPLED = [("pld", "M", "chain", 1), ("pld", "M", "chain", 4), ("pld", "M", {"kind": "dynamic", "nodes": 4, "top_k": 2}, 4),
           ("lookahead", "M", "chain", 1), ("lookahead", "M", {"kind": "shape", "shape": [2, 2]}, 4),
           ("lookahead", "M", {"kind": "template", "paths": [[0], [1], [0, 0]]}, 4),
           ("ngram(prompt_lookup_min=1,prompt_lookup_max=2)", "M", "chain", 4), ("sam(len_threshold=2)", "M", "chain", 4),
           ("recycling(shared=1)", "M", "chain", 1), ("recycling(shared=1)", "M", {"kind": "shape", "shape": [2, 2]}, 4),
           ("word-draft+pld", "ML", "chain", 4)]


@pytest.mark.slow
@pytest.mark.parametrize("drafter,methods,verify,batch", SAMPLED)
def test_sampling_with_a_lookup_keeps_the_targets_distribution(drafter, methods, verify, batch):
    """A prompt whose suffix occurs earlier: pld, ngram and sam propose one token (then the image
    cuts their plan), accepted with p(c) or resampled from p without c, then draft nothing;
    lookahead's trie ranks what followed "a b"; a shared recycling matrix ranks, from the second
    request on, what the target ranked after "b" and after the tokens it drew before; a random
    draft's M mixed with pld by static weights proposes pld's c."""
    from pipeline.models.hf import HFLlava
    from pipeline.models.lookup_draft import LookupDraft
    from pipeline.models.mixed_draft import MixedDraft
    from pipeline.models.tiny import build_llava, llava_processor
    from tests.test_sampling import RUNS, TOLERANCE, exact_two_token_distribution, total_variation, word_tokenizer

    tokenizer = word_tokenizer()
    target = HFLlava(build_llava(tokenizer, seed=0), llava_processor(tokenizer), "word-target")
    name = drafter.rpartition("+")[2]
    lookup = LookupDraft(target, name, *lookup_spec(name))
    if "+" in drafter:
        model = HFLlava(build_llava(tokenizer, seed=7), llava_processor(tokenizer), "word-draft")
        lookup = MixedDraft(model, lookup, drafter)
    sample = Sample("unit", "test", 0, "first", "a b c <image> a b", (solid((200, 30, 30)),))
    exact = exact_two_token_distribution(target, sample=sample)
    config = DecodeConfig(methods, gamma=2, temperature=1.0, max_new_tokens=2, verify=make_verify(verify))
    config = replace(config, gamma=config.verify.settled(len(methods), 2)[1])
    counts: dict[tuple[int, ...], int] = {}
    accepted = 0
    for start in range(0, RUNS, batch):
        requests = [replace(sample, row=start + i) for i in range(batch)] if batch > 1 else [sample]
        for record in speculative_decode(target, lookup, requests, replace(config, seed=start if batch == 1 else 0)):
            counts[tuple(record.output_ids)] = counts.get(tuple(record.output_ids), 0) + 1
            accepted += sum(record.accepted_per_block)
    assert total_variation({k: v / RUNS for k, v in counts.items()}, exact) < TOLERANCE
    assert accepted > 0, "the drafter's proposals were tested, and some kept"
    c = tokenizer.convert_tokens_to_ids("c")
    assert 0.5 < sum(v for k, v in counts.items() if k[0] != c) / RUNS, "the target mostly rejects c"


def test_a_lookups_step_is_calibrated_as_its_own_cost(tiny_dirs):
    target, drafts = load_target_and_drafts(tiny_dirs["target"], {"pld": "pld"})
    calibration = calibrate(target, drafts["pld"], repeats=2, rounds=1)
    assert 0 < calibration.ratio_draft_target < 1


def test_a_grid_names_lookups_by_kind_or_with_hyperparameters(tmp_path):
    grid = lambda draft: parse_grid({"datasets": ["embedded_vqa"], "pairs": [{"target": "embedded:target",
                                                                               "draft": draft}],
                                     "methods": ["AR", "M", "MT"], "max_new_tokens": 8})
    assert grid("pld").pairs[0].draft == "pld"
    assert grid({"lookup": "pld", "num_output_tokens": 10}).pairs[0].draft == "pld"  # the default
    named = grid({"lookup": "ngram", "prompt_lookup_max": 6}).pairs[0].draft  # vLLM: min follows max
    assert named == "ngram(prompt_lookup_max=6,prompt_lookup_min=6)" == grid("ngram(prompt_lookup_max=6)").pairs[0].draft
    # min 2 with the default max 5 could not be written as min alone (that sets max to 2 too)
    assert grid({"lookup": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5}).pairs[0].draft == (
        "ngram(num_speculative_tokens=5,prompt_lookup_max=5,prompt_lookup_min=2)")
    spec = parse_grid({"datasets": ["embedded_vqa"], "pairs": [{"target": "embedded:target", "draft": "sam"}],
                       "methods": ["AR", "M", "MT"], "verify": ["chain", "candidates", "bandit"], "max_new_tokens": 8})
    drafted = [c for c in spec.configs() if c.decode.methods != "AR"]
    assert {c.decode.methods for c in drafted} == {"M"}  # a lookup drafts with M alone
    # its chain (a candidate tree of one method is its chain) replays; a grid runs no tree of a
    # point mass (its other nodes would hold tokens of probability 0)
    assert [(c.decode.verify.kind, c.replayable) for c in drafted] == [("chain", True)]
    # a ranking lookup's trees grow from its weights: it runs them, replayed like a model's
    spec = parse_grid({"datasets": ["embedded_vqa"], "pairs": [{"target": "embedded:target", "draft": "lookahead"}],
                       "methods": ["M"], "verify": ["chain", "bandit"], "max_new_tokens": 8})
    assert sorted((c.decode.verify.kind, c.replayable) for c in spec.configs()) == [("bandit", True), ("chain", True)]
    for bad, words in ((("pld(max_matching_ngram_size=0)"), "max_matching_ngram_size"),
                       ({"lookup": "pld", "window": 3}, "window"), ({"lookup": "pdl"}, "did you mean"),
                       ("recycling(shared=2)", "shared must be 0")):
        with pytest.raises(GridError, match=words):
            grid(bad)
    with pytest.raises(GridError, match="never a target"):
        parse_grid({"datasets": ["embedded_vqa"], "pairs": [{"target": "pld", "draft": "embedded:draft"}],
                    "methods": ["M"], "max_new_tokens": 8})


MIXED_VERIFY = ("chain", "candidates", {"kind": "dynamic", "nodes": 8, "top_k": 3}, {"kind": "shape", "shape": [3, 2]},
                "bandit")


@pytest.fixture(scope="module")
def mixed(tiny_dirs):
    """The tiny draft beside prompt lookup, drafting for the bigram target (the draft is far from it)."""
    name = f"{tiny_dirs['draft']}+pld"
    target, drafts = load_target_and_drafts(tiny_dirs["bigram_target"], {name: name})
    return target, drafts[name]


def policies():
    from pipeline.drafting.policies import make_policy

    return [make_policy("static"), make_policy("grid", measure="hard+soft"), make_policy("inverse", temperature=1.0)]


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_an_ensemble_across_drafters_is_the_targets_own_greedy_output(mixed, engine):
    """The draft's M (and T) with the lookup, every policy, every verify kind, batch 1 and 3."""
    target, draft = mixed
    cases = [("ML", p, "chain", 3) for p in policies()] + [("MTL", policies()[2], v, 3) for v in MIXED_VERIFY[1:]]
    assert max(greedy_blocks(target, draft, cases, engine)) >= 2


def test_replay_scores_an_ensemble_across_drafters_as_live_decodes_it(mixed):
    """The lookup's distributions are made per block in replay, as the live rows make them; the
    weights a policy learns from them agree too."""
    from pipeline.decoding.replay import replay
    from pipeline.decoding.traces import collect_traces

    target, draft = mixed
    batch = quoting(target, prompts(3))
    traces = [collect_traces(target, draft, s, "MTL", max_new_tokens=MAX_NEW) for s in batch]
    learned = []
    for methods, policy, verify in [("ML", p, "chain") for p in policies()] + [
            ("MTL", policies()[1], "candidates"), ("ML", policies()[0], "bandit")]:
        spec = make_verify(verify)
        config = DecodeConfig(methods, policy=policy, gamma=3, max_new_tokens=MAX_NEW, verify=spec)
        config = replace(config, verify=spec.settled(len(methods), 3)[0], gamma=spec.settled(len(methods), 3)[1])
        for live, trace in zip(speculative_decode(target, draft, batch, config), traces):
            replayed = replay(trace, config)
            assert replayed.output_ids == live.output_ids, (methods, verify)
            assert replayed.accepted_per_block == live.accepted_per_block, (methods, policy, verify)
            for a, b in zip(replayed.weights_per_block, live.weights_per_block):
                assert a == pytest.approx(b, abs=1e-5)
            learned += [w[-1] for w in live.weights_per_block]
    assert min(learned) < 0.5 < max(learned), "a policy moved the lookup's weight both ways"


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_a_head_and_a_lookup_ensemble_is_the_targets_own_greedy_output(tiny_dirs, engine, monkeypatch):
    """EAGLE's head beside prompt lookup: its M with L, every policy, chain and trees, batch 1 and
    3. The head reads each block's accepted tokens again with the target's states, and the
    lookup's rows with it: its context gets every kept token once, in order."""
    from pipeline.lookups.prompt_lookup import PromptLookup

    name = f"eagle:{tiny_dirs['eagle_head']}+pld"
    target, drafts = load_target_and_drafts(tiny_dirs["bigram_target"], {name: name})
    contexts: dict[int, list[list[int]]] = {}  # each lookup's extends: its prompt, then what each block kept
    extend = PromptLookup.extend
    monkeypatch.setattr(PromptLookup, "extend",
                        lambda self, tokens: (contexts.setdefault(id(self), []).append(list(tokens)),
                                              extend(self, tokens)))
    cases = [("ML", p, "chain", 3) for p in policies()] + [("ML", policies()[1], v, 3) for v in MIXED_VERIFY[1:3]]
    assert max(greedy_blocks(target, drafts[name], cases, engine)) >= 2
    batch = quoting(target, prompts(1))
    contexts.clear()
    record = speculative_decode(target, drafts[name], batch, DecodeConfig("ML", gamma=3, max_new_tokens=MAX_NEW),
                                engine=engine)[0]
    ((_, *blocks),) = contexts.values()
    kept = [token for block in blocks for token in block]  # the prompt's last token, then the output
    prompt = tokenize(drafts[name], batch[0]).ids
    # all but the last two blocks' (a block's accepted tokens are read, and kept, in the next one)
    assert kept == [prompt[-1], *record.output_ids][: len(kept)] and len(kept) >= len(record.output_ids) + 1 - 2 * 4
    assert max(record.accepted_per_block) >= 2
    calibration = calibrate(target, drafts[name], repeats=2, rounds=1)
    assert 0 < calibration.ratio_draft_target


def test_a_grid_mixes_a_draft_with_a_lookup():
    grid = lambda draft, methods=("AR", "M", "ML", "MTL", "L"): parse_grid(
        {"datasets": ["embedded_vqa"], "pairs": [{"target": "embedded:target", "draft": draft}],
         "methods": list(methods), "max_new_tokens": 8})
    spec = grid(["embedded:small_draft", {"lookup": "pld", "num_output_tokens": 4}])
    assert spec.pairs[0].draft == "embedded:small_draft+pld(num_output_tokens=4)"
    # the draft's own sets are its own pair's, L alone the lookup's: the mixed pair runs what mixes
    assert sorted(c.decode.methods for c in spec.configs()) == ["AR", "ML", "MTL"]
    assert all(c.replayable for c in spec.configs())
    assert sorted(c.decode.methods for c in grid("embedded:small_draft").configs()) == ["AR", "M"]
    # beside a head: its M with L, live (a head drafts from its own guesses, which replay never makes)
    assert [(c.decode.methods, c.replayable) for c in grid("embedded:head+pld").configs()
            if c.decode.methods != "AR"] == [("ML", False)]
    for bad, words in (("pld+pld", "a draft model or a head, not 'pld'"),
                       (["embedded:small_draft", "embedded:draft"], "not a draft-free lookup")):
        with pytest.raises(GridError, match=words):
            grid(bad)


def test_token_recycling_learns_the_targets_own_candidates():
    """On test_sampling's 11-word target greedy SD with recycling is the target's own output on a
    chain and a tree; nothing is proposed before the target has read a token, and a token's row,
    once the target has read it, is the target's top tokens there, best first."""
    from pipeline.models.hf import HFLlava
    from pipeline.models.lookup_draft import LookupDraft
    from pipeline.models.tiny import build_llava, llava_processor
    from tests.test_sampling import word_tokenizer

    tokenizer = word_tokenizer()
    target = HFLlava(build_llava(tokenizer, seed=0), llava_processor(tokenizer), "word-target")
    lookup = LookupDraft(target, "recycling", "recycling", lookup_spec("recycling")[1])
    batch = [Sample("unit", "test", i, "first", text, (solid((200, 30, 30)),))
             for i, text in enumerate(["a <image> b c", "c d <image> e", "<image> f a b c d"])]
    reference = autoregressive_decode(target, batch, max_new_tokens=MAX_NEW)
    for verify in ("chain", {"kind": "template"}):  # its published tree, "2.2.2"
        config = DecodeConfig("M", gamma=3, max_new_tokens=MAX_NEW, verify=make_verify(verify))
        for record, ar in zip(speculative_decode(target, lookup, batch, config), reference):
            assert record.output_ids == ar.output_ids
            if verify == "chain":  # a chain proposes only what the matrix holds
                assert record.accepted_per_block[0] == 0  # an empty matrix proposes nothing
    rows, _ = prefilled_rows(lookup, [tokenize(lookup, batch[0])], "M", None, engine="eager", capacity=8,
                             role="draft")
    assert bool(rows.feed([7], valid=[1]).isfinite().all()) and bool(rows.abstains.all())
    rows.observe_target(torch.tensor([[7, 9]]), torch.arange(16).view(1, 2, 8) % len(tokenizer))
    assert int(rows.feed([9], valid=[1])[0, -1].argmax()) == 8 % len(tokenizer)  # 9's row, best first
    assert not grid_replays("recycling")


def test_a_shared_recycling_matrix_carries_what_one_request_learned_to_the_next(tiny_dirs):
    """The reference's evaluation (`shared=1`): one matrix across requests. The bigram target
    answers the three prompts alike, so each request after the first finds the rows the earlier
    ones verified, where a matrix per request starts empty every time; the output is the
    target's own either way."""
    target, own = lookup_pair(tiny_dirs, "recycling")
    _, shared = lookup_pair(tiny_dirs, "recycling(shared=1)")
    batch = prompts(3)
    config = DecodeConfig("M", gamma=6, max_new_tokens=MAX_NEW, verify=make_verify({"kind": "template"}))
    accepted = []
    for sample, ar in zip(batch, autoregressive_decode(target, batch, max_new_tokens=MAX_NEW)):
        alone, carried = (speculative_decode(target, draft, [sample], config)[0] for draft in (own, shared))
        assert alone.output_ids == carried.output_ids == ar.output_ids
        accepted.append((sum(alone.accepted_per_block), sum(carried.accepted_per_block)))
    assert accepted[0][0] == accepted[0][1]  # the first request finds the shared matrix empty
    assert all(carried > 2 * alone for alone, carried in accepted[1:]), accepted


def grid_replays(draft: str) -> bool:
    spec = parse_grid({"datasets": ["embedded_vqa"], "pairs": [{"target": "embedded:target", "draft": draft}],
                       "methods": ["M"], "verify": ["chain", "bandit"], "max_new_tokens": 8})
    return any(c.replayable for c in spec.configs())
