"""One decoder for every batch size: every verify kind (chain, candidates, dynamic, shape, bandit
and a kind of one's own) with a Llama draft and a Mamba2 draft, greedy and sampled, at batch 1,
2 and 3. Greedy SD equals AR at the same batch, which equals each request's batch-1 output;
a sampled request draws what it draws alone; a request that stops at an EOS mid-block leaves
the others going; fp16 on both engines; a block is one host transfer at any batch. Prompts
differ in length and image size (LLaVA-NeXT gives them different numbers of image tokens)."""
from __future__ import annotations

import pytest
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import Decoder, autoregressive_decode, speculative_decode
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy, StaticPolicy
from pipeline.models.loading import load_model
from pipeline.planning.verify_entries import make_verify
from tests.conftest import FixedCaptioner
from tests.test_engine_static import counting_host_reads
from tests.test_own_verify_kind import OneMethodChain

MAX_NEW = 20
# the answers start differently: the bigram target's output follows from the last token alone
PROMPTS = [
    ("USER: <image>\nWhat is it? ASSISTANT: It", (200, 30, 30), (64, 48)),
    ("USER: <image>\nDescribe the picture in a few words, please. ASSISTANT: A", (30, 200, 30), (96, 40)),
    ("USER: <image>\nColour? ASSISTANT: The", (30, 30, 200), (40, 120)),
]
# every kind, at depths whose trees stay small; the bandit's shapes differ in depth and nodes,
# so requests of one block verify trees of different sizes once their bandits part ways
KINDS = {"chain": "chain", "candidates": "candidates", "dynamic": {"kind": "dynamic", "nodes": 8, "top_k": 3},
         "shape": {"kind": "shape", "shape": [3, 2, 1]}, "bandit": {"kind": "bandit", "shapes": [[2, 2], [3, 1, 1, 1]]},
         "own": OneMethodChain(method=1), "eagle2": {"kind": "eagle2", "depth": 2, "top_k": 3, "total_tokens": 8}}
DRAFTS = {"llama": ("target", "draft"), "mamba2": ("bigram_target", "mamba2_draft")}


def samples(n: int, first: int = 0) -> list[Sample]:
    return [Sample("toy", "test", first + i, "first", text, (Image.new("RGB", size, colour),))
            for i, (text, colour, size) in enumerate((PROMPTS * 2)[:n])]


def config(kind: str, temperature: float = 0.0, methods: str = "MT", policy=None) -> DecodeConfig:
    verify = make_verify(KINDS[kind])
    gamma = {"shape": 3, "bandit": 4}.get(kind, 3)
    # an eagle2 tree serves no learning policy (its history would be unread below most candidates)
    policy = policy or (StaticPolicy() if kind == "eagle2" else GridSearchPolicy())
    return DecodeConfig(methods, policy, gamma=gamma, temperature=temperature, max_new_tokens=MAX_NEW, seed=11,
                        verify=verify)


def decode(pair, batch: list[Sample], decode_config: DecodeConfig, engine: str = "static") -> list:
    target, draft = pair
    return speculative_decode(target, draft, batch, decode_config, FixedCaptioner(), engine=engine)


@pytest.fixture(scope="module")
def pairs(tiny_dirs):
    return {name: (load_model(tiny_dirs[t]), load_model(tiny_dirs[d])) for name, (t, d) in DRAFTS.items()}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("draft", list(DRAFTS))
def test_greedy_sd_at_batch_1_2_3_is_ar_at_the_same_batch_and_each_requests_batch_1_output(pairs, draft, kind):
    pair = pairs[draft]
    alone = [autoregressive_decode(pair[0], [s], max_new_tokens=MAX_NEW)[0].output_ids for s in samples(3)]
    ragged = mixed_shapes = False
    for batch in (1, 2, 3):
        ar = autoregressive_decode(pair[0], samples(batch), max_new_tokens=MAX_NEW)
        assert [r.output_ids for r in ar] == alone[:batch]
        records = decode(pair, samples(batch), config(kind))
        assert [r.output_ids for r in records] == alone[:batch], (draft, kind, batch)
        assert all(r.error is None and r.mode == "live" for r in records)
        assert {r.batch_requests for r in records} == {None if batch == 1 else batch}
        blocks = list(zip(*(r.accepted_per_block for r in records)))
        ragged |= any(len(set(block)) > 1 for block in blocks)
        mixed_shapes |= any(len(set(arms)) > 1 for arms in zip(*(r.shape_per_block for r in records)))
    assert ragged  # requests accepted different counts in one block: each row kept its own
    assert mixed_shapes or kind != "bandit"  # requests of one block drafted trees of different shapes


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("draft", list(DRAFTS))
def test_a_sampled_request_draws_what_it_draws_alone(pairs, draft, kind):
    """Each request draws from its own generator in the order it would alone. Its output is then
    its batch-1 output wherever the batch's arithmetic gives the same distributions; a Mamba2
    draft's batched steps round differently in the last bits, which moves some acceptance
    tests, and so may a Llama draft's wider padding: measured here, every output equal at
    batch 2 and 3."""
    alone = [decode(pairs[draft], [s], config(kind, temperature=1.0))[0].output_ids for s in samples(3)]
    for batch in (2, 3):
        together = decode(pairs[draft], samples(batch), config(kind, temperature=1.0))
        assert [r.output_ids for r in together] == alone[:batch], batch
    assert len({tuple(output) for output in alone}) > 1  # the requests really sampled apart


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_a_request_that_stops_at_eos_mid_block_leaves_the_others_going(pairs, draft, monkeypatch):
    target, _ = pairs[draft]
    alone = [r.output_ids for r in autoregressive_decode(target, samples(3), max_new_tokens=MAX_NEW)]
    others = set(alone[1]) | set(alone[2])
    stop = next(t for t in alone[0][3:] if t not in others)  # a token only the first request emits
    eos = target.eos_token_ids | {stop}
    monkeypatch.setattr(type(target), "eos_token_ids", property(lambda self: eos))
    cut = alone[0][: alone[0].index(stop) + 1]
    assert [r.output_ids for r in autoregressive_decode(target, samples(3), max_new_tokens=MAX_NEW)] == \
        [cut, alone[1], alone[2]]
    for kind in KINDS:
        records = decode(pairs[draft], samples(3), config(kind))
        assert [r.output_ids for r in records] == [cut, alone[1], alone[2]], kind
        assert len(records[0].accepted_per_block) < len(records[1].accepted_per_block)
        assert records[0].time_request_s < records[1].time_request_s


@pytest.mark.parametrize("engine", ["static", "eager"])
def test_fp16_greedy_sd_at_batch_2_is_ar_at_batch_2_on_both_engines(tiny_dirs, engine):
    for target_name, draft_name in (("next_target", "draft"), ("bigram_target", "mamba2_draft")):
        target, draft = load_model(tiny_dirs[target_name], dtype="fp16"), load_model(tiny_dirs[draft_name], dtype="fp16")
        ar = [r.output_ids for r in autoregressive_decode(target, samples(2), max_new_tokens=MAX_NEW, engine=engine)]
        for kind in KINDS:
            records = decode((target, draft), samples(2), config(kind), engine=engine)
            assert [r.output_ids for r in records] == ar, (target_name, kind, engine)


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_a_batch_gives_each_request_its_accepted_counts_and_weights_alone(pairs, draft):
    """fp32: each request's accepted counts and TABED weights at batch 3 are its batch-1 ones:
    grid weights exactly; continuous inverse-error weights within a few units of the records' sixth
    decimals (a batch pads the rows wider, which rounds their last bits apart). A draft that
    proposes worse in a batch costs only acceptance, never output, so only this catches it (a
    state-space row once fell back to its block's start on every feed after a filler)."""
    for kind, policy in (("chain", GridSearchPolicy()), ("candidates", GridSearchPolicy()),
                         ("chain", InverseErrorPolicy())):
        batch = decode(pairs[draft], samples(3), config(kind, policy=policy))
        alone = [decode(pairs[draft], [s], config(kind, policy=policy))[0] for s in samples(3)]
        assert [r.accepted_per_block for r in batch] == [r.accepted_per_block for r in alone]
        if isinstance(policy, GridSearchPolicy):
            assert [r.weights_per_block for r in batch] == [r.weights_per_block for r in alone]
        weights = lambda records: [w for r in records for block in r.weights_per_block for w in block]
        # Mamba2's batched forward rounds a little further apart (3e-6 measured)
        assert weights(batch) == pytest.approx(weights(alone), abs={"llama": 1.5e-6, "mamba2": 5e-6}[draft])


@pytest.mark.parametrize("engine", ["static", "eager"])
def test_one_host_transfer_per_block_at_batch_3(pairs, engine, monkeypatch):
    """Proposals, acceptance, weights and history of every request stay on the device."""
    per_block, block = [], Decoder.block

    def measured(self):
        with counting_host_reads() as counts:
            stop = block(self)
        per_block.append(counts["reads"])
        return stop

    monkeypatch.setattr(Decoder, "block", measured)
    for kind in KINDS:
        for temperature in (0.0, 1.0):
            per_block.clear()
            records = decode(pairs["llama"], samples(3), config(kind, temperature), engine=engine)
            assert len(per_block) == max(len(r.accepted_per_block) for r in records) > 3
            assert set(per_block) == {1}, (kind, temperature, per_block)


def test_a_decodes_energy_is_split_over_its_requests_by_new_tokens(pairs, monkeypatch):
    """Where a GPU's counter can be read, each row carries its share of its batch's joules
    (sums over rows are the energy spent); where none can (this CPU), every row says None."""
    import pipeline.decoding.timing as timing

    assert all(r.energy_j is None for r in decode(pairs["llama"], samples(2), config("chain")))
    readings = iter([100.0, 130.0])
    monkeypatch.setattr(timing, "energy_meter", lambda device: lambda: next(readings))
    records = decode(pairs["llama"], samples(2), config("chain"))
    assert sum(r.energy_j for r in records) == pytest.approx(30.0)
    assert [r.energy_j / 30.0 for r in records] == pytest.approx(
        [r.new_tokens / sum(x.new_tokens for x in records) for r in records])
