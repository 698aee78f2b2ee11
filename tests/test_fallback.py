"""A GPU run you can trust: when compiling a decode step fails, the step runs uncompiled; when
the static engine fails under `engine: auto`, the worker decodes on eager; the rows say how
each decode ran, and the outputs stay the target's own greedy output.

Compiling is forced on the CPU (TABED_COMPILE=1) and made to fail with a torch.compile
backend that raises, the same path a GPU takes before capturing a CUDA graph of the compiled
step (`pipeline.models.hf.HFModel._compiled_step`).
"""
from __future__ import annotations

import logging

import pytest
import torch
from PIL import Image
from transformers import CompileConfig

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.drafting.policies import GridSearchPolicy
from pipeline.planning.grid import ModelGroup, RunConfig, Shard

pytestmark = pytest.mark.slow
CONFIG = DecodeConfig(methods="MT", policy=GridSearchPolicy(), gamma=3, max_new_tokens=12)


class FailingBackend:
    """A torch.compile backend that refuses graphs whose inputs have a dimension of `tokens`
    (every graph when None) and runs the others as traced. It counts what it refused in a
    list shared with its copies (torch.compile may copy a backend object)."""

    def __init__(self, tokens: int | None = None) -> None:
        self.tokens, self.refusals = tokens, []

    @property
    def refused(self) -> int:
        return len(self.refusals)

    def __deepcopy__(self, memo):
        return self

    def __call__(self, graph, example_inputs, **options):
        shapes = [tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)]
        if self.tokens is None or any(len(s) >= 2 and s[1] == self.tokens for s in shapes):
            self.refusals.append(shapes)
            raise RuntimeError("injected compiler failure")
        return graph.forward


def sample(index: int = 0) -> Sample:
    colour = ["red", "blue"][index % 2]
    return Sample("toy", "test", index, "first", "USER: <image>\nWhat colour is it? ASSISTANT:",
                  (Image.new("RGB", (40, 40), colour),))


@pytest.fixture
def fresh_pair(tiny_dirs, monkeypatch):
    """A tiny pair of its own (compile state and failures are per model), compiling on the CPU."""
    from pipeline.models.loading import load_pair

    monkeypatch.setenv("TABED_COMPILE", "1")
    torch._dynamo.reset()
    yield load_pair(tiny_dirs["target"], tiny_dirs["draft"])
    torch._dynamo.reset()


def with_backend(models, backend) -> None:
    for model in models:
        model.step_compile = CompileConfig(backend=backend, fullgraph=False)


def test_a_failed_compile_falls_back_once_per_step_shape_and_the_record_says_so(fresh_pair, monkeypatch, caplog):
    target, draft = fresh_pair
    expected = autoregressive_decode(target, [sample()], max_new_tokens=CONFIG.max_new_tokens, engine="eager")[0].output_ids
    backend = FailingBackend()
    with_backend(fresh_pair, backend)
    with caplog.at_level(logging.WARNING, logger="pipeline.models.hf"):
        first = speculative_decode(target, draft, [sample()], CONFIG, engine="static")[0]
    assert first.output_ids == expected and first.error is None
    assert first.steps == "uncompiled" and first.engine == "static"
    assert "compiled 2x1 step failed (" in first.fallback and "injected compiler failure" in first.fallback
    warned = [r.getMessage() for r in caplog.records]
    shapes = len(target._failed_steps) + len(draft._failed_steps)
    assert backend.refused == shapes and len(warned) == shapes >= 2  # draft steps and the verify, once each
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline.models.hf"):
        second = speculative_decode(target, draft, [sample(1)], CONFIG, engine="static")[0]
    assert backend.refused == shapes and not caplog.records  # known failures are not tried again
    assert second.steps == "uncompiled" and second.fallback  # the rows still say how they ran
    eager = speculative_decode(target, draft, [sample(1)], CONFIG, engine="eager")[0]
    assert (second.output_ids, second.accepted_per_block) == (eager.output_ids, eager.accepted_per_block)
    assert eager.steps == "uncompiled" and eager.fallback is None


def test_only_the_failing_step_shape_falls_back(fresh_pair):
    """The verify (gamma + 1 = 4 tokens) fails to compile, the draft steps compile: both modes recorded."""
    target, draft = fresh_pair
    backend = FailingBackend(tokens=CONFIG.gamma + 1)
    with_backend(fresh_pair, backend)
    record = speculative_decode(target, draft, [sample()], CONFIG, engine="static")[0]
    assert record.steps == "compiled+uncompiled"
    assert record.fallback.startswith("compiled 1x4 step failed") and ";" not in record.fallback
    assert list(target._failed_steps) == [(1, 4, 4, 256, ())] and not draft._failed_steps
    eager = speculative_decode(target, draft, [sample()], CONFIG, engine="eager")[0]
    assert (record.output_ids, record.accepted_per_block) == (eager.output_ids, eager.accepted_per_block)


def test_a_plain_forward_error_is_not_taken_for_a_compile_failure(fresh_pair):
    """A step that fails uncompiled too raises its own error and marks no shape as failed."""
    target, draft = fresh_pair
    with_backend(fresh_pair, FailingBackend())
    real = target._forward

    def broken(cache, keep, compiled, **inputs):
        if not compiled and inputs.get("input_ids") is not None and inputs["input_ids"].shape[1] > 1:
            raise ValueError("a bad input")
        return real(cache, keep, compiled, **inputs)

    target._forward = broken
    with pytest.raises(ValueError, match="a bad input"):
        speculative_decode(target, draft, [sample()], CONFIG, engine="static")[0]
    assert not target._failed_steps


def worker_rows(worker, configs, samples):
    group = worker.group
    items = tuple((c, s.sample_id) for s in samples for c in configs)
    shard = Shard("r", group, "toy", "first", "live", items, tuple((s.sample_id, s.prompt_hash) for s in samples))
    return worker.run_shard(shard, {s.sample_id: s for s in samples}).to_pylist()


def test_worker_rows_record_the_fallback_device_and_versions(tiny_dirs, monkeypatch):
    from actors.target_worker import TargetWorker

    monkeypatch.setenv("TABED_COMPILE", "1")
    torch._dynamo.reset()
    group = ModelGroup(tiny_dirs["target"], "fp32", (tiny_dirs["draft"],))
    worker = TargetWorker(group)
    with_backend((worker.target, *worker.drafts.values()), FailingBackend())
    pair = group.pairs[0]
    configs = [RunConfig(pair, DecodeConfig("AR", gamma=None, max_new_tokens=10)), RunConfig(pair, DecodeConfig("M", gamma=3, max_new_tokens=10))]
    rows = worker_rows(worker, configs, [sample()])
    torch._dynamo.reset()
    ar, sd = rows
    assert ar["error"] is None and sd["error"] is None and sd["output_ids"] == ar["output_ids"]
    assert (ar["engine"], ar["steps"], sd["engine"], sd["steps"]) == ("static", "uncompiled", "static", "uncompiled")
    assert "step failed" in ar["fallback"] and "step failed" in sd["fallback"]
    assert sd["device_name"].startswith("cpu: ") and "threads)" in sd["device_name"]
    assert sd["torch_version"] == torch.__version__ and sd["transformers_version"]


def test_engine_auto_falls_back_from_a_failing_static_engine_to_eager(tiny_dirs, caplog):
    """The static cache breaks (as for a model family without static-cache support): `auto` rows
    are decoded on eager with a note, once logged; a grid that names `static` gets error rows."""
    from actors.target_worker import TargetWorker

    group = ModelGroup(tiny_dirs["target"], "fp32", (tiny_dirs["draft"],))
    worker = TargetWorker(group)

    def no_static(*args, **kwargs):
        raise RuntimeError("this model's attention cannot use a static cache")

    for model in (worker.target, *worker.drafts.values()):
        model.static_cache = no_static
    pair = group.pairs[0]
    configs = [RunConfig(pair, DecodeConfig("AR", gamma=None, max_new_tokens=10)), RunConfig(pair, DecodeConfig("MT", gamma=3, max_new_tokens=10))]
    with caplog.at_level(logging.WARNING, logger="pipeline.execution.shard_records"):
        rows = worker_rows(worker, configs, [sample(0), sample(1)])
    assert all(r["error"] is None and r["engine"] == "eager" for r in rows)
    assert all(r["fallback"].startswith("static engine failed (RuntimeError: this model's attention") for r in rows)
    assert len(caplog.records) == 1
    for ar, sd in (rows[:2], rows[2:]):
        assert sd["output_ids"] == ar["output_ids"]
    named = [RunConfig(pair, DecodeConfig("M", gamma=3, max_new_tokens=10), engine="static")]
    row, = worker_rows(worker, named, [sample(0)])
    assert row["error"].startswith("RuntimeError: this model's attention") and row["engine"] == "static"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_failed_cuda_graph_capture_falls_back_on_gpu(tiny_dirs):
    """A compiled step that reads a value on the host works eagerly but cannot be captured:
    the capture fails, the step runs uncompiled, and the output is still the target's own."""
    from pipeline.models.loading import load_pair

    target, draft = load_pair(tiny_dirs["target"], tiny_dirs["draft"], device="cuda")

    def syncing_backend(graph, example_inputs, **options):
        def run(*args):
            float(args[0].float().sum())  # a host read: illegal while a CUDA graph is being captured
            return graph.forward(*args)
        return run

    with_backend((target,), syncing_backend)
    record = speculative_decode(target, draft, [sample()], CONFIG, engine="static")[0]
    eager = speculative_decode(target, draft, [sample()], CONFIG, engine="eager")[0]
    assert (record.output_ids, record.accepted_per_block) == (eager.output_ids, eager.accepted_per_block)
    assert record.steps == "captured+uncompiled" and "compiled 1x4 step failed" in record.fallback
