"""A target too large for one GPU, spread over the GPUs its actor holds (`pipeline.models.sharding`):
the plan for the real Qwen2.5-VL-72B and InternVL3-78B shapes (built on meta tensors, no memory),
the refusal of a target that would not fit, greedy SD equal to AR through accelerate's
dispatch hooks (the mechanism that spreads a model), and a spread target's steps kept off the
compiled path, saying why. (Its worker holding several GPUs through Ray: `test_ray_grid`.)"""
from __future__ import annotations

import re
from collections import Counter

import pytest
import torch
import transformers
from accelerate import dispatch_model
from transformers import InternVLConfig, Qwen2_5_VLConfig

from pipeline.decoding.engine import SPREAD_UNCOMPILED
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.models.loading import ModelLoadError, load_model, load_target_and_drafts
from pipeline.models.sharding import (
    DoesNotFit, check_fits_one_gpu, empty_model, on_devices, on_each_device, plan_device_map,
)
from pipeline.models.tiny import TINY_FAMILIES
from pipeline.planning.grid import GridError
from pipeline.planning.grid_file import parse_grid
from tests.test_today_vlms import SAMPLES, config

GIB = 1 << 30
H200, H100 = 139 * GIB, 79 * GIB  # what torch reports free on an idle card
QWEN_72B_TEXT = dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                     intermediate_size=29568, tie_word_embeddings=False)
REAL = {  # the published shapes, and the published parameter counts they must give
    "Qwen/Qwen2.5-VL-72B-Instruct": (
        transformers.Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLConfig(text_config={**QWEN_72B_TEXT, "vocab_size": 152064},
                         vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3456,
                                            out_hidden_size=8192, num_heads=16)),
        73.4e9, 7.5e9),  # the Qwen2.5-VL-3B draft's weights
    "OpenGVLab/InternVL3-78B-hf": (
        transformers.InternVLForConditionalGeneration,
        InternVLConfig(text_config={**QWEN_72B_TEXT, "model_type": "qwen2", "vocab_size": 151674},
                       vision_config=dict(hidden_size=3200, num_hidden_layers=45, num_attention_heads=25,
                                          intermediate_size=12800, image_size=[448, 448], patch_size=[14, 14],
                                          use_qk_norm=True, norm_type="rms_norm", use_mean_pooling=False)),
        78.4e9, 1.9e9),  # the InternVL3-1B draft's
}


def budgets(free: int, gpus: int, draft: float) -> dict[int, int]:
    """What `gpu_budgets` reads on idle cards with the draft loaded on the first."""
    return {i: int((free - (draft if i == 0 else 0)) * 0.8) for i in range(gpus)}


@pytest.mark.parametrize("name", REAL)
def test_a_72b_target_is_spread_over_two_h200s_or_three_h100s_and_refused_on_one_or_two_h100s(name):
    model_class, model_config, parameters, draft = REAL[name]
    model = empty_model(model_class, model_config, torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(parameters, rel=1e-3)
    layers = len(model.model.language_model.layers)
    for free, gpus in ((H200, 2), (H100, 3)):
        placement = plan_device_map(model, budgets(free, gpus, draft), name)
        devices = [placement[m] for m in placement if m.startswith("model.language_model.layers.")]
        per_gpu = Counter(devices)
        assert len(devices) == layers and set(per_gpu) == set(range(gpus))
        assert min(per_gpu.values()) >= 0.6 * layers / gpus  # balanced, so is each GPU's KV cache
        reads_the_prompt = [m for m in placement
                            if "vis" in m or "projector" in m or m.endswith("embed_tokens")]
        assert reads_the_prompt and all(placement[m] == 0 for m in reads_the_prompt)
    with pytest.raises(DoesNotFit, match=rf"{name} \(1[45]\d\.\d GB in bfloat16\) does not fit on one GPU "
                                         r"\(84.8 GB free\): .*`gpus:` in the grid"):
        check_fits_one_gpu(model, H100, name)  # refused before a weight is read
    with pytest.raises(DoesNotFit, match=rf"{name} \(1[45]\d\.\d GB in bfloat16\) does not fit on 2 GPUs: "
                                         r"[\d.]+ \+ [\d.]+ GB are left .*`gpus:` in the grid"):
        plan_device_map(model, budgets(H100, 2, draft), name)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_greedy_sd_equals_ar_through_the_hooks_that_spread_a_target(tiny_dirs, family):
    """accelerate's hooks move each layer's inputs to its device and the outputs back (here all
    on the CPU, the only device): chains, candidate trees and the bandit over a batch of two
    requests (one with two images) decode what the target decodes alone, on both engines."""
    target = load_model(tiny_dirs[f"{family}_target"])
    draft = load_model(tiny_dirs[f"{family}_draft"])
    alone = [autoregressive_decode(target, [s], max_new_tokens=20, engine="eager")[0].output_ids
             for s in SAMPLES]
    dispatch_model(target.model, device_map={"": "cpu"}, force_hooks=True)
    assert target.model._hf_hook.io_same_device  # the hook that returns the logits to the first GPU
    for engine in ("static", "eager"):
        assert [r.output_ids for r in autoregressive_decode(target, SAMPLES, max_new_tokens=20,
                                                            engine=engine)] == alone
        for kind in ("chain", "candidates", "bandit"):
            records = speculative_decode(target, draft, SAMPLES, config(kind), engine=engine)
            assert [r.output_ids for r in records] == alone, (engine, kind)


def test_a_spread_targets_steps_run_uncompiled_and_say_why(tiny_dirs, monkeypatch):
    monkeypatch.setenv("TABED_COMPILE", "1")  # what a GPU asks for
    target = load_model(tiny_dirs["qwen2_5_vl_target"])
    target.gpus = 2  # as `load_model(..., gpus=2)` leaves it
    record = autoregressive_decode(target, SAMPLES[:1], max_new_tokens=4, engine="static")[0]
    assert record.steps == "uncompiled" and SPREAD_UNCOMPILED in record.fallback


def test_spreading_over_gpus_this_process_does_not_see_is_refused(tiny_dirs):
    with pytest.raises(ModelLoadError, match=r"cannot spread .*target' over 2 GPUs: this process sees 0"):
        load_target_and_drafts(tiny_dirs["target"], {"d": tiny_dirs["draft"]}, gpus=2)


def test_indices_are_copied_to_each_device_once_and_tensors_grouped_by_device():
    index = torch.arange(3)
    on = on_devices(index)
    assert on(torch.device("cpu")) is index and on(torch.device("meta")) is on(torch.device("meta"))
    first, second, meta = torch.zeros(1), torch.ones(1), torch.zeros(1, device="meta")
    assert on_each_device([first, meta, second]) == [[first, second], [meta]]


def test_a_pairs_gpus_are_read_from_the_grid_and_must_agree_for_one_target(tiny_dirs):
    target, draft = tiny_dirs["target"], tiny_dirs["draft"]
    pairs = [{"target": target, "draft": draft, "gpus": 2},
             {"target": target, "draft": tiny_dirs["next_target"]}]
    grid = lambda pairs: {"name": "g", "datasets": ["embedded_vqa"], "methods": ["M"], "pairs": pairs}
    assert parse_grid(grid(pairs)).spread == ((target, "fp32", 2),)
    assert parse_grid(grid(pairs[1:])).spread == ()
    for gpus, problem in ((0, "pairs[0].gpus: expected an integer from 1 to 64, got 0"),
                          ("2", "pairs[0].gpus: expected an integer from 1 to 64, got '2'")):
        with pytest.raises(GridError, match=re.escape(problem)):
            parse_grid(grid([{**pairs[0], "gpus": gpus}]))
    with pytest.raises(GridError, match=re.escape(f"pairs[1].gpus: 1, but an earlier pair of target {target} "
                                                  "(fp32) gave 2")):
        parse_grid(grid([pairs[0], {**pairs[1], "gpus": 1}]))
