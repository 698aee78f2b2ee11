"""The static engine: same results as the eager one, one host transfer per block, caches that
are allocated once and rolled back in place."""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch

import pipeline.decoding.loop as live
from pipeline.decoding.config import DecodeConfig
from pipeline.planning.verify_entries import make_verify
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from tests.conftest import FixedCaptioner
from tests.test_engine_lossless import CONFIGS, PROMPTS, sample_of

MAX_NEW = 32
SAMPLING = DecodeConfig(methods="MT", policy=InverseErrorPolicy(), temperature=0.8, max_new_tokens=MAX_NEW, seed=3)
BLOCK_CONFIGS = {  # one of each block kind: single method, grid weights, inverse weights, sampling, trees
    "M": DecodeConfig(methods="M", max_new_tokens=MAX_NEW),
    "MT*": DecodeConfig(methods="MT", policy=GridSearchPolicy(), max_new_tokens=MAX_NEW),
    "MTCP*": DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(window=4), max_new_tokens=MAX_NEW),
    "sampling": SAMPLING,
    "MT* candidates": DecodeConfig(methods="MT", policy=GridSearchPolicy(), max_new_tokens=MAX_NEW,
                                   verify=make_verify("candidates")),
    "MTCP* dynamic": DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(), max_new_tokens=MAX_NEW,
                                  verify=make_verify({"kind": "dynamic", "nodes": 12, "top_k": 3})),
    "sampling candidates": replace(SAMPLING, verify=make_verify("candidates")),
}


def decode_both(tiny_pair, config: DecodeConfig, sample):
    target, draft = tiny_pair
    return [speculative_decode(target, draft, [sample], config, FixedCaptioner(), engine=e)[0] for e in ("static", "eager")]


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_static_and_eager_engines_agree(tiny_pair, config_name, gamma):
    config = DecodeConfig(**{**CONFIGS[config_name].__dict__, "gamma": gamma, "max_new_tokens": MAX_NEW})
    for name, text, images in PROMPTS:
        static, eager = decode_both(tiny_pair, config, sample_of(name, text, images))
        assert (static.engine, eager.engine) == ("static", "eager")
        assert static.output_ids == eager.output_ids, name
        assert static.accepted_per_block == eager.accepted_per_block, name
        # grid weights are discrete and must match; inverse-error weights are continuous and
        # move in the 6th decimal with the attention's rounding over a different cache length
        flat = lambda record: [w for block in record.weights_per_block for w in block]
        assert flat(static) == pytest.approx(flat(eager), abs=2e-6), name


def test_engines_agree_when_sampling(tiny_pair):
    """Seeded sampling draws the same uniforms in both engines, so the same tokens come out."""
    name, text, images = PROMPTS[0]
    static, eager = decode_both(tiny_pair, SAMPLING, sample_of(name, text, images))
    assert static.output_ids == eager.output_ids
    assert static.accepted_per_block == eager.accepted_per_block


def test_autoregressive_engines_agree(tiny_pair):
    target, _ = tiny_pair
    for name, text, images in PROMPTS:
        sample = sample_of(name, text, images)
        runs = [autoregressive_decode(target, [sample], max_new_tokens=MAX_NEW, engine=e)[0] for e in ("static", "eager")]
        assert runs[0].output_ids == runs[1].output_ids


# Every way a tensor's value can reach Python; on a GPU each one waits for the device.
HOST_READS = ("item", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__")


@contextmanager
def counting_host_reads():
    counts = {"reads": 0}
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(original):
        def wrapper(self, *args, **kwargs):
            counts["reads"] += 1
            return original(self, *args, **kwargs)
        return wrapper

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def reads_per_block(monkeypatch, tiny_pair, config: DecodeConfig, engine: str) -> list[int]:
    """Host reads during each `Decoder.block` call of one decode."""
    per_block: list[int] = []
    block = live.Decoder.block

    def measured(self):
        with counting_host_reads() as counts:
            result = block(self)
        per_block.append(counts["reads"])
        return result

    monkeypatch.setattr(live.Decoder, "block", measured)
    name, text, images = PROMPTS[2]
    target, draft = tiny_pair
    record = speculative_decode(target, draft, [sample_of(name, text, images)], config, FixedCaptioner(), engine=engine)[0]
    assert len(per_block) == record.blocks > 3
    return per_block


@pytest.mark.parametrize("engine", ["static", "eager"])
@pytest.mark.parametrize("config", BLOCK_CONFIGS.values(), ids=BLOCK_CONFIGS.keys())
def test_one_host_transfer_per_block(monkeypatch, tiny_pair, config, engine):
    """Proposals, mixing, acceptance, weights and history stay on the device: the block's
    outcome comes back in exactly one transfer."""
    assert set(reads_per_block(monkeypatch, tiny_pair, config, engine)) == {1}


def test_the_counter_sees_a_host_read(monkeypatch, tiny_pair):
    """Guard against a vacuous count: an `.item()` slipped into the block is caught."""
    import pipeline.decoding.proposals as verification  # a chain's greedy rule (`accept_greedy`)

    verify = verification.verify_greedy

    def syncing(proposals, logits, depths=None):
        accepted, token = verify(proposals, logits, depths)
        accepted.item()
        return accepted, token

    monkeypatch.setattr(verification, "verify_greedy", syncing)
    assert set(reads_per_block(monkeypatch, tiny_pair, DecodeConfig(methods="M", max_new_tokens=MAX_NEW), "static")) == {2}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_one_device_sync_per_block_on_gpu(tiny_dirs):
    """On a GPU, torch's own sync detector counts the waits inside each block."""
    from pipeline.models.loading import load_pair

    target, draft = load_pair(tiny_dirs["target"], tiny_dirs["draft"], device="cuda")
    name, text, images = PROMPTS[2]
    sample = sample_of(name, text, images)
    config = DecodeConfig(methods="MT", policy=GridSearchPolicy(), max_new_tokens=MAX_NEW)
    speculative_decode(target, draft, [sample], config, engine="static")[0]  # compile outside the count
    block, per_block = live.Decoder.block, []

    def measured(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                result = block(self)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        # only the syncs themselves: setting the mode first warns that it is a prototype
        per_block.append([f"{w.filename}:{w.lineno}" for w in caught
                          if "called a synchronizing CUDA operation" in str(w.message)])
        return result

    live.Decoder.block = measured
    try:
        speculative_decode(target, draft, [sample], config, engine="static")[0]
    finally:
        live.Decoder.block = block
    assert all(len(sites) == 1 for sites in per_block), per_block  # the sites name any extra wait


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("config", BLOCK_CONFIGS.values(), ids=BLOCK_CONFIGS.keys())
def test_captured_steps_match_eager_on_gpu(tiny_dirs, config):
    """fp32 on a GPU: CUDA-graph steps give eager's tokens and accepted counts, sample after
    sample (graphs are reused with new prompts and write positions)."""
    from pipeline.models.loading import load_pair

    pair = load_pair(tiny_dirs["target"], tiny_dirs["draft"], device="cuda")
    for name, text, images in PROMPTS:
        static, eager = decode_both(pair, config, sample_of(name, text, images))
        assert (static.output_ids, static.accepted_per_block) == (eager.output_ids, eager.accepted_per_block)
    ar = autoregressive_decode(pair[0], [sample_of(*PROMPTS[0])], max_new_tokens=MAX_NEW, engine="static")[0]
    assert ar.output_ids == autoregressive_decode(pair[0], [sample_of(*PROMPTS[0])], max_new_tokens=MAX_NEW, engine="eager")[0].output_ids


def test_static_caches_are_allocated_once_and_reused(tiny_pair):
    """Rejections move the write position; a second sample reuses the pooled cache tensors."""
    target, draft = tiny_pair
    name, text, images = PROMPTS[0]
    config = DecodeConfig(methods="MT", max_new_tokens=MAX_NEW)
    speculative_decode(target, draft, [sample_of(name, text, images)], config, engine="static")[0]
    pooled = {key: [layer.keys.data_ptr() for layer in cache.layers] for key, cache in draft._static_caches.items()}
    record = speculative_decode(target, draft, [sample_of(name, text, images)], config, engine="static")[0]
    assert any(a < 4 for a in record.accepted_per_block)  # rejections happened
    again = {key: [layer.keys.data_ptr() for layer in cache.layers] for key, cache in draft._static_caches.items()}
    assert again == pooled


@pytest.mark.slow
def test_compiled_static_steps_match_eager_and_compile_once(monkeypatch, tiny_dirs):
    """The GPU path (decode steps through torch.compile) forced on the CPU: same tokens and
    accepted counts as eager, and a second sample of the same shapes compiles nothing new."""
    from torch._dynamo.utils import counters

    from pipeline.models.loading import load_pair

    monkeypatch.setenv("TABED_COMPILE", "1")
    target, draft = load_pair(tiny_dirs["target"], tiny_dirs["draft"])
    config = DecodeConfig(methods="MT", gamma=3, max_new_tokens=24)
    samples = [sample_of(*PROMPTS[0]), sample_of(*PROMPTS[2])]
    first = speculative_decode(target, draft, [samples[0]], config, engine="static")[0]
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0  # the steps really went through the compiler
    second = speculative_decode(target, draft, [samples[1]], config, engine="static")[0]
    assert counters["stats"]["unique_graphs"] == graphs
    monkeypatch.setenv("TABED_COMPILE", "0")
    for compiled, sample in zip((first, second), samples):
        eager = speculative_decode(target, draft, [sample], config, engine="eager")[0]
        assert (compiled.output_ids, compiled.accepted_per_block) == (eager.output_ids, eager.accepted_per_block)
