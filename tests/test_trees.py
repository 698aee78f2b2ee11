"""Token trees: greedy tree verification gives the target's own greedy output for every family,
verify kind, method set and gamma; the tree structures themselves on hand-built cases; trees in
the grid (axis, keys, live or replay); one host transfer per block."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import speculative_decode
from pipeline.decoding.trees import Tree, candidate_tree
from pipeline.decoding.acceptance import verify_tree_greedy
from pipeline.decoding.verify_kinds import Chain, DynamicTree
from pipeline.planning.verify_entries import make_verify
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.models.families import FAMILIES
from pipeline.models.loading import load_model
from pipeline.models.tiny import build_family_pair
from tests.conftest import FixedCaptioner, solid
from tests.test_model_families import hf_greedy

MAX_NEW = 24
VERIFY = {"chain": make_verify("chain"), "candidates": make_verify("candidates"),
          "dynamic": make_verify({"kind": "dynamic", "nodes": 12, "top_k": 3})}


def configs(pooling: bool) -> dict[str, DecodeConfig]:
    """M, MT, MT* and MTCP* (MTC* where the family cannot pool image features for P)."""
    big = "MTCP" if pooling else "MTC"
    return {"M": DecodeConfig(methods="M"), "MT": DecodeConfig(methods="MT"),
            "MT*": DecodeConfig(methods="MT", policy=GridSearchPolicy()),
            f"{big}*": DecodeConfig(methods=big, policy=InverseErrorPolicy())}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_case(request, tmp_path_factory):
    """A tiny target and draft of the family, a two-image prompt and the target's own generate."""
    target_dir, draft_dir = build_family_pair(request.param, tmp_path_factory.mktemp(request.param))
    target, draft = load_model(str(target_dir)), load_model(str(draft_dir))
    sample = Sample("unit", "test", 0, "first", "USER: Source: <image> Target: <image> Explain the difference. ASSISTANT:",
                    (solid((20, 20, 200)), solid((200, 40, 20), size=(40, 70))))
    return request.param, target, draft, sample, hf_greedy(target, sample, MAX_NEW)


@pytest.mark.slow
@pytest.mark.parametrize("verify", list(VERIFY))
def test_greedy_trees_equal_the_targets_own_greedy_output(family_case, verify):
    """Every family x verify kind x {M, MT, MT*, MTCP*} x gamma 1/3/5, on both engines."""
    family, target, draft, sample, reference = family_case
    for name, config in configs(FAMILIES[family].pooling).items():
        for gamma in (1, 3, 5):
            for engine in ("static", "eager"):
                run = replace(config, gamma=gamma, max_new_tokens=MAX_NEW, verify=VERIFY[verify])
                record = speculative_decode(target, draft, [sample], run, FixedCaptioner(), engine=engine)[0]
                assert record.output_ids == reference, (family, verify, name, gamma, engine)
                assert all(0 <= a <= gamma for a in record.accepted_per_block)
                assert all(abs(sum(w) - 1) < 1e-5 for w in record.weights_per_block)


def test_trees_accept_more_than_the_chain_on_a_draft_that_disagrees(tiny_pair):
    """The tiny draft disagrees with its target often: the extra branches must find accepted
    tokens the chain missed (a tree that never helped would be a chain with a cost)."""
    target, draft = tiny_pair
    sample = Sample("unit", "test", 0, "first", "USER: <image>\nWhat is in this image? ASSISTANT:", (solid((200, 20, 20)),))
    base = DecodeConfig(methods="MT", policy=GridSearchPolicy(), gamma=5, max_new_tokens=32)
    tau = {kind: speculative_decode(target, draft, [sample], replace(base, verify=spec), FixedCaptioner())[0].tau
           for kind, spec in VERIFY.items()}
    assert tau["candidates"] > tau["chain"] and tau["dynamic"] > tau["chain"], tau


def test_a_candidate_tree_merges_equal_prefixes():
    chains = torch.tensor([[5, 6, 7], [5, 6, 9], [8, 6, 7]])
    other = torch.tensor([[1, 2, 3], [4, 2, 3], [1, 2, 3]])  # a second request's chains: its own tree
    tree = candidate_tree(torch.stack([chains, other]), merge=True)
    assert tree.valid[0].tolist() == [True, True, True, False, False, True, True, True, True]
    # branch 1 shares 5, 6 with branch 0: its third node hangs under branch 0's second (fed 2)
    assert tree.parents[0].tolist() == [0, 1, 2, 0, 1, 2, 0, 7, 8]
    assert tree.depths[0].tolist() == [1, 2, 3] * 3
    assert tree.valid[1].tolist() == [True] * 6 + [False] * 3 and tree.parents[1].tolist() == [0, 1, 2, 0, 4, 5, 0, 1, 2]
    apart = candidate_tree(chains[None], merge=False)
    assert apart.valid.all() and apart.parents[0].tolist() == [0, 1, 2, 0, 4, 5, 0, 7, 8]


def test_greedy_tree_verification_follows_the_targets_choice():
    """root -> 5 -> {6 -> 7, 9}, and a second branch 8; the target wants 5, 9, then 4. A second
    request with the same tree wants 8, then 2: each request walks its own path."""
    tree = Tree(tokens=torch.tensor([[5, 6, 7, 9, 8]] * 2), parents=torch.tensor([[0, 1, 2, 1, 0]] * 2),
                depths=torch.tensor([[1, 2, 3, 2, 1]] * 2), valid=torch.ones(2, 5, dtype=torch.bool), gamma=3)
    wanted = torch.tensor([[5, 9, 0, 0, 4, 0], [8, 0, 0, 0, 0, 2]])  # the target's argmax at each fed position
    logits = torch.nn.functional.one_hot(wanted, 10).float()
    outcome = verify_tree_greedy(tree, logits)
    assert outcome.accepted.tolist() == [2, 1] and outcome.next_token.tolist() == [4, 2]
    assert outcome.path.tolist() == [[0, 1, 4, 0], [0, 5, 0, 0]]  # root, 5, 9; root, 8
    seen = tree.ancestry()[0]
    assert seen[3].tolist() == [True, True, True, True, False, False]  # 7 sees root, 5, 6, itself
    assert seen[5].tolist() == [True, False, False, False, False, True]
    nothing = verify_tree_greedy(tree, torch.nn.functional.one_hot(torch.tensor([[3, 0, 0, 0, 0, 0]] * 2), 10).float())
    assert nothing.accepted.tolist() == [0, 0] and nothing.next_token.tolist() == [3, 3]
    assert nothing.path.tolist() == [[0, 0, 0, 0]] * 2


def test_the_verify_axis_in_grids_keys_and_modes():
    from pipeline.planning.grid import GridError, Pair, RunConfig, normalise
    from pipeline.planning.grid_file import parse_grid
    from pipeline.planning.shards import decode_mode

    pair = Pair("tiny:target", "tiny:draft")
    chain = RunConfig(pair, DecodeConfig("MT", gamma=3))
    assert chain.key() == replace(chain, decode=replace(chain.decode, verify=Chain())).key()  # chains keep their keys from before trees
    candidates = replace(chain, decode=replace(chain.decode, verify=make_verify("candidates")))
    assert candidates.key() != chain.key()
    assert normalise(replace(candidates, decode=replace(candidates.decode, methods="M"))).decode.verify.is_chain  # one method's candidate tree is its chain
    dynamic = normalise(replace(chain, decode=replace(chain.decode, verify=make_verify({"kind": "dynamic", "nodes": 40, "top_k": 4}))))
    assert dynamic.decode.verify.nodes == 12  # at most gamma x top_k
    assert (decode_mode(candidates, "auto"), decode_mode(dynamic, "auto")) == ("replay", "live")
    raw = {"name": "g", "datasets": ["embedded_vqa"], "methods": ["AR", "M", "MT"], "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}]}
    spec = parse_grid(raw | {"verify": ["chain", "candidates", {"kind": "dynamic", "top_k": 2}]})
    assert {c.decode.verify.label for c in spec.configs() if c.decode.methods == "MT"} == {"chain", "candidates", "dynamic(n=10,k=2)"}
    with pytest.raises(GridError, match=r"verify\[0\]: unknown verify kind 'forest'"):
        parse_grid(raw | {"verify": "forest"})
    # a dynamic tree's depth is its draft steps per block: the row's gamma, whatever the gamma axis says
    deep = parse_grid(raw | {"gamma": [3, 5], "verify": [{"kind": "dynamic", "top_k": 2, "depth": 4}]}).configs()
    assert [(c.decode.gamma, c.decode.verify) for c in deep if c.decode.methods == "MT"] == [(4, DynamicTree(8, 2))]
    at_gamma_4 = parse_grid(raw | {"gamma": [4], "verify": [{"kind": "dynamic", "top_k": 2}]}).configs()
    assert {c.key() for c in deep} == {c.key() for c in at_gamma_4}
    with pytest.raises(GridError, match=r"verify\[0\]: dynamic tree depth must be an integer from 1 to 64, got 0"):
        parse_grid(raw | {"verify": [{"kind": "dynamic", "depth": 0}]})
    with pytest.raises(GridError, match=r"verify\[0\]: \['depth'\] not a field of verify kind 'candidates'"):
        parse_grid(raw | {"verify": [{"kind": "candidates", "depth": 3}]})
    with pytest.raises(ValueError, match="depth 4 with gamma 3"):
        DecodeConfig(gamma=3, verify=make_verify({"kind": "dynamic", "depth": 4})).validate()
    sampled = parse_grid(raw | {"verify": [{"kind": "dynamic"}], "temperature": [0.0, 1.0], "mode": "auto"}).configs()
    assert {c.decode.temperature for c in sampled if c.decode.verify.kind == "dynamic"} == {0.0, 1.0}  # sampled: SpecExec's rule
    with pytest.raises(GridError, match="cannot score dynamic trees"):
        parse_grid(raw | {"verify": [{"kind": "dynamic"}], "mode": "replay"})


@pytest.mark.slow
def test_greedy_trees_are_lossless_in_fp16(tiny_dirs):
    """fp16 forwards (on the CPU here): trees still give the target's own greedy output."""
    from pipeline.decoding.loop import autoregressive_decode
    from pipeline.models.loading import load_pair
    from tests.test_engine_lossless import PROMPTS, sample_of

    target, draft = load_pair(tiny_dirs["target"], tiny_dirs["draft"], dtype="fp16")
    for name, text, images in PROMPTS:
        sample = sample_of(name, text, images)
        reference = autoregressive_decode(target, [sample], max_new_tokens=MAX_NEW)[0].output_ids
        for verify in ("candidates", "dynamic"):
            for config in (DecodeConfig(methods="MT", policy=GridSearchPolicy()), DecodeConfig(methods="MTCP", policy=InverseErrorPolicy())):
                run = replace(config, gamma=3, max_new_tokens=MAX_NEW, verify=VERIFY[verify])
                assert speculative_decode(target, draft, [sample], run, FixedCaptioner())[0].output_ids == reference, (name, verify)


SHAPES = {1: [3], 3: [3, 2, 1], 5: [2, 2, 2, 1, 1]}  # a shape tree's depth is its gamma
# a template that is no shape: the top child branches deeper than the others
TEMPLATE = {"kind": "template", "paths": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0, 0]]}


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["shape", "bandit", "template"])
def test_greedy_shape_bandit_and_template_trees_equal_the_targets_own_greedy_output(family_case, verify):
    """Every family x {M, MT, MT*, MTCP*} x shapes of depth 1/3/5 (or the bandit's pool, or a
    template) x engine."""
    family, target, draft, sample, reference = family_case
    for name, config in configs(FAMILIES[family].pooling).items():
        for gamma in (1, 3, 5) if verify == "shape" else (None,):
            entry = {"kind": "shape", "shape": SHAPES[gamma]} if verify == "shape" else \
                {"bandit": {"kind": "bandit", "lambda": 0.5}, "template": TEMPLATE}[verify]
            for engine in ("static", "eager"):
                run = replace(config, max_new_tokens=MAX_NEW, verify=make_verify(entry))
                record = speculative_decode(target, draft, [sample], run, FixedCaptioner(), engine=engine)[0]
                assert record.output_ids == reference, (family, verify, name, gamma, engine)
                if verify == "bandit":
                    assert len(record.shape_per_block) == len(record.accepted_per_block)
                    assert set(record.shape_per_block[:3]) == {0, 1, 2}  # every shape played once first


@pytest.mark.slow
def test_shape_bandit_and_template_trees_replay_exactly(tiny_dirs):
    """fp64 KV rows: greedy replay from the ranks of the target's tokens gives live decoding's
    accepted counts and the bandit's choices, block by block; Token Recycling's template too."""
    from pipeline.decoding.traces import collect_traces
    from pipeline.decoding.replay import replay

    target, draft = load_model(tiny_dirs["target"]), load_model(tiny_dirs["draft"])
    for model in (target, draft):
        model.model.double()
        model.dtype = torch.float64
    sample = Sample("unit", "test", 0, "first", "USER: <image>\nDescribe the image. ASSISTANT:", (solid((30, 160, 90)),))
    traces = collect_traces(target, draft, sample, "MTCP", FixedCaptioner(), max_new_tokens=MAX_NEW, engine="eager")
    entries = [{"kind": "shape", "shape": shape} for shape in SHAPES.values()]
    entries += [{"kind": "bandit"}, {"kind": "bandit", "shapes": [[2, 1], [1, 1, 1, 1], [4]], "c": 0.3, "costs": [2, 3, 1]}]
    entries += [TEMPLATE, {"kind": "template"}]
    for name, config in configs(True).items():
        for entry in entries:
            run = replace(config, max_new_tokens=MAX_NEW, verify=make_verify(entry))
            live = speculative_decode(target, draft, [sample], run, FixedCaptioner(), engine="eager")[0]
            replayed = replay(traces, run)
            assert (replayed.accepted_per_block, replayed.shape_per_block) == (live.accepted_per_block, live.shape_per_block)
            assert replayed.output_ids == live.output_ids, (name, entry)


def test_a_template_tree_is_token_recyclings_by_default_or_the_paths_a_grid_writes():
    from pipeline.decoding.draft_template import TemplateTreeProposer
    from pipeline.decoding.template_kind import template_levels
    from pipeline.planning.grid import GridError
    from pipeline.planning.grid_file import parse_grid
    from pipeline.planning.verify_entries import verify_of_row

    published = make_verify({"kind": "template"})
    # the reference's "2.2.2": 80 nodes on 6 levels (its README), its gamma the depth
    assert [len(level) for level in template_levels(published.nodes)] == [8, 21, 25, 15, 8, 3]
    assert (published.label, published.settled(1, 5)[1], published.tree_nodes(0, 1)) == \
        ("template(recycling-2.2.2)", 6, 80)
    own = make_verify({"kind": "template", "paths": [[1], [0], [0, 0]]})
    assert own.nodes == ((1,), (0,), (0, 0)) and own.label.startswith("template(3n,")
    assert verify_of_row(own.columns()) == own and verify_of_row(published.columns()) == published
    # greedy replay follows y's ranks down the template: (1,) is a leaf, (0,) has its rank 0 below
    rule = TemplateTreeProposer.replay_rule(DecodeConfig("M", verify=own))
    q = torch.tensor([[[0.5, 0.3, 0.2]], [[0.2, 0.7, 0.1]]])  # ranks: 0, 1, 2; then 1, 0, 2
    accepted = {tuple(y): rule.accepted(q, y, 0, 2, torch.ones(1)) for y in ([1, 1], [0, 1], [0, 0], [2, 1])}
    assert accepted == {(1, 1): 1, (0, 1): 2, (0, 0): 1, (2, 1): 0}
    raw = {"name": "g", "datasets": ["embedded_vqa"], "methods": ["AR", "M"],
           "pairs": [{"target": "tiny:target", "draft": "tiny:draft"}]}
    for paths, words in (("recycling", "unknown tree template 'recycling'"), ([[0, 1]], "need their parents"),
                         ([[0], [0]], "lists a node twice"), ([[64]], "ranks from 0 to 63")):
        with pytest.raises(GridError, match=words):
            parse_grid(raw | {"verify": [{"kind": "template", "paths": paths}]})


def test_the_bandit_plays_each_shape_then_the_best_bound():
    from pipeline.decoding.draft_bandit import UCB1

    bandit = UCB1(3, c=1.0)
    for arm, reward in ((0, -1.0), (1, -0.2), (2, -0.5)):
        assert bandit.choose() == arm
        bandit.update(arm, reward)
    assert bandit.choose() == 1  # equal counts: the best mean
    bandit = UCB1(2, c=10.0)
    for _ in range(5):
        bandit.update(0, -0.1)
    bandit.update(1, -0.9)
    assert bandit.choose() == 1  # rarely played: exploration wins at a large c


def test_spec_llavas_own_tree_runs_as_a_dynamic_entry(tiny_pair):
    """127 nodes by top-31 expansion: greedy it is the target's own output; sampled, it runs
    (SpecExec's rule; the distribution is tested on smaller trees in test_sampling)."""
    from pipeline.decoding.loop import autoregressive_decode

    target, draft = tiny_pair
    sample = Sample("unit", "test", 0, "first", "USER: <image>\nDescribe the image. ASSISTANT:", (solid((90, 20, 160)),))
    spec = make_verify({"kind": "dynamic", "nodes": 127, "top_k": 31})
    greedy = speculative_decode(target, draft, [sample], DecodeConfig(methods="MT", gamma=5, max_new_tokens=16, verify=spec))[0]
    assert greedy.output_ids == autoregressive_decode(target, [sample], max_new_tokens=16)[0].output_ids
    sampled = speculative_decode(target, draft, [sample], DecodeConfig(methods="MT", gamma=5, max_new_tokens=16, verify=spec,
                                                                     temperature=1.0, seed=3))[0]
    assert len(sampled.output_ids) == 16 and sampled.error is None
