"""The sections `bench/gpu_check.py` runs, one per process: each yields its `name=value` figures
as it measures them (a section stopped at its share keeps what it printed);
what it cannot measure here it gives as `unmeasured (why)` (no CUDA, no NVML), and an error
(out of memory, say) makes the whole section unmeasured, never a zero."""
from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a plain copy of the repo

from bench import gpu_batch, gpu_engine  # noqa: E402
from bench.gpu_heads import head_section  # noqa: E402
from bench.qwen_shapes import build_qwen_pair  # noqa: E402
from bench.real_shapes import DRAFTS, build_pair, pair_shape, step_weight_bytes  # noqa: E402
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.engine import default_engine  # noqa: E402
from pipeline.decoding.loop import autoregressive_decode, speculative_decode  # noqa: E402
from pipeline.drafting.policies import GridSearchPolicy, StaticPolicy  # noqa: E402
from pipeline.models.devices import device_name, energy_meter  # noqa: E402
from pipeline.models.reference import generate_inputs, reference_greedy  # noqa: E402
from pipeline.planning.verify_entries import make_verify  # noqa: E402

Figures = Iterator[tuple[str | None, object]]  # a None name: a comment line for the log
EXACT_VERIFY = ("chain", "candidates", "dynamic", "bandit")
GPU_TESTS = ["tests/test_engine_static.py", "tests/test_fallback.py", "tests/test_head_drafts.py",
             "-k", "on_gpu"]


def device_of(args: argparse.Namespace) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_section(args: argparse.Namespace) -> Figures:
    """What ran: printed by the parent before any section."""
    yield from {"device": device_name(device_of(args)), "torch": torch.__version__,
                "transformers": transformers.__version__}.items()


def gpu_tests_section(args: argparse.Namespace) -> Figures:
    """The GPU-only tests (captured steps against eager): last, since on a cold machine they
    compile for a minute or more and `exact` has already held SD to AR on the device."""
    if not torch.cuda.is_available():
        yield "gpu_tests", "unmeasured (no CUDA: the GPU-only tests skip)"
        return
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *GPU_TESTS],
                         cwd=ROOT, capture_output=True, text=True)
    counts = dict((kind, int(n)) for n, kind in re.findall(r"(\d+) (passed|failed|error)", run.stdout))
    failed = [line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    yield "gpu_tests_passed", counts.get("passed", 0)
    yield "gpu_tests_failed", counts.get("failed", 0) + counts.get("error", 0)
    if failed:
        yield "gpu_tests_failures", "; ".join(failed)


def exact_section(args: argparse.Namespace) -> Figures:
    """Greedy SD against AR at the same batch (1 and 3) on the family's tiny pair, every verify kind."""
    from pipeline.models.loading import load_pair
    from pipeline.models.tiny import build_family_pair, build_tiny_pair

    device = device_of(args)
    samples = gpu_engine.make_samples(3)
    with tempfile.TemporaryDirectory() as out:
        built = build_tiny_pair(out) if args.family == "llava" else build_family_pair(args.family, out)
        target_dir, draft_dir = built
        for dtype in ("fp32", "fp16", "bf16"):
            target, draft = load_pair(str(target_dir), str(draft_dir), dtype=dtype, device=device)
            if dtype == "fp32":
                yield "exact_family", target.family
            pairs = [(sd, ar) for batch in (1, 3) for sd, ar in tiny_outputs(target, draft, samples, batch)]
            differ = [next(i for i, (a, b) in enumerate(zip(sd + [-1], ar + [-2])) if a != b)
                      for sd, ar in pairs if sd != ar]
            if dtype == "bf16":
                yield "bf16_divergence", len(differ) / len(pairs)
                yield "bf16_first_divergence", min(differ) if differ else "none"
            else:
                yield f"exact_{dtype}", f"{len(pairs) - len(differ)}/{len(pairs)}"


def tiny_outputs(target, draft, samples, batch: int) -> list[tuple[list[int], list[int]]]:
    """(SD, AR) outputs per request; eager engine (the GPU-only tests hold captured steps to
    eager's outputs; compiling every step shape of three dtypes would take minutes)."""
    engine = "eager"
    groups = [samples[i : i + batch] for i in range(0, len(samples), batch)]
    ar = [r.output_ids for g in groups for r in autoregressive_decode(target, g, max_new_tokens=24,
                                                                      engine=engine)]
    out = []
    for verify in EXACT_VERIFY:
        config = DecodeConfig(methods="MT", policy=GridSearchPolicy(), max_new_tokens=24,
                              verify=make_verify(verify))
        captioner = gpu_engine.ColourCaptioner()
        sd = [r.output_ids for g in groups
              for r in speculative_decode(target, draft, g, config, captioner, engine=engine)]
        out += list(zip(sd, ar))
    return out


def decode_section(args: argparse.Namespace) -> Figures:
    """The family's 7B-shaped pair built once, its steps compiled and captured once: our AR step against
    the floor, SD over AR and transformers' assisted generation, then SD over AR per batch size.
    Comment lines say when each part ended, since compiling is most of a cold machine's time."""
    start = time.perf_counter()
    device = device_of(args)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    pair = family_pair(args, device, dtype)
    yield "decode_pair", f"{pair[0].name} <- {pair[1].name}"
    for part in (target_step_figures, sd_speedup_figures, batch_figures):
        yield from part(args, *pair)
        yield None, f"{part.__name__.removesuffix('_figures')} done at {time.perf_counter() - start:.0f} s"


def family_pair(args: argparse.Namespace, device: torch.device, dtype: torch.dtype):
    """The (target, draft) of `--family` and `--shapes`, the draft agreeing on 70% of tokens."""
    if args.family == "llava":
        return build_pair(pair_shape(args.shapes, args.draft), 0.7, device, dtype)
    return build_qwen_pair(args.shapes, 0.7, device, dtype)


def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process: a timed decode must add none."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def target_step_figures(args: argparse.Namespace, target, draft) -> Figures:
    samples = gpu_engine.make_samples(2)
    engine = default_engine(target, draft)
    decode = lambda sample: autoregressive_decode(target, [sample], max_new_tokens=args.max_new_tokens,
                                                  engine=engine)[0]  # one request: a list is one batch
    decode(samples[0])  # compiles and captures the batch-1 step
    compiled_before = compiled_graphs()
    records = [decode(sample) for sample in samples]
    yield "target_step_compiles_while_timed", compiled_graphs() - compiled_before  # 0, or the step is stale
    bandwidth = gpu_engine.copy_bandwidth_gb_s(target.device)
    step = 1000 * sum(r.time_verify_s for r in records) / sum(r.new_tokens for r in records)
    floor = step_weight_bytes(target) / bandwidth / 1e6
    yield from {"target_step_ms": step, "floor_ms": floor, "target_step_over_floor": step / floor,
                "copy_bandwidth_gb_s": bandwidth}.items()


def sd_speedup_figures(args: argparse.Namespace, target, draft) -> Figures:
    """SD M and MT* over our AR, transformers' assisted generation over its own greedy AR, and
    the energy of our AR and SD M decodes (NVML's counter, read around the timed decodes)."""
    device, new = target.device, args.max_new_tokens
    samples = gpu_engine.make_samples(3)
    engine = default_engine(target, draft)
    decoders = {"ar": lambda s: autoregressive_decode(target, [s], max_new_tokens=new, engine=engine)[0]}
    for key, (methods, policy) in {"M": ("M", StaticPolicy), "MTstar": ("MT", GridSearchPolicy)}.items():
        config = DecodeConfig(methods=methods, policy=policy(), max_new_tokens=new)
        decoders[key] = lambda s, c=config: speculative_decode(target, draft, [s], c, engine=engine)[0]
    draft.model.generation_config.num_assistant_tokens_schedule = "constant"
    draft.model.generation_config.num_assistant_tokens = 5
    inputs = {s.sample_id: generate_inputs(target, s) for s in samples}  # built before anything is timed
    decoders["hf_ar"] = lambda s: reference_greedy(target, inputs[s.sample_id], new)
    decoders["hf_assisted"] = lambda s: reference_greedy(target, inputs[s.sample_id], new,
                                                        assistant_model=draft.model)
    meter = energy_meter(device)
    runs, energy, compiles_while_timed = {}, {}, 0
    for name, decode in decoders.items():
        decode(samples[0])  # warm-up: compiles and captures
        gpu_engine.synchronize(device)
        compiled_before, start_j, start = compiled_graphs(), meter and meter(), time.perf_counter()
        results = [decode(s) for s in samples]
        gpu_engine.synchronize(device)
        runs[name] = (time.perf_counter() - start, results)
        energy[name] = meter and meter() - start_j
        compiles_while_timed += compiled_graphs() - compiled_before
    yield "sd_speedup_compiles_while_timed", compiles_while_timed
    ids = {name: [getattr(r, "output_ids", r) for r in results] for name, (_, results) in runs.items()}
    rate = {name: sum(map(len, ids[name])) / seconds for name, (seconds, _) in runs.items()}
    figures = {f"sd_speedup_{k}": rate[k] / rate["ar"] for k in ("M", "MTstar")}
    figures["hf_assisted_speedup"] = rate["hf_assisted"] / rate["hf_ar"]
    equal = sum(m == mt == ar for m, mt, ar in zip(ids["M"], ids["MTstar"], ids["ar"]))
    figures["sd_equals_ar"] = f"{equal}/3"
    figures["hf_assisted_equals_hf_ar"] = f"{sum(a == b for a, b in zip(ids['hf_assisted'], ids['hf_ar']))}/3"
    figures["ar_tokens_per_s"] = rate["ar"]
    if meter is None:
        yield from figures.items()
        yield "energy", "unmeasured (no NVML: pynvml missing, no NVIDIA device or no energy counter)"
        return
    accepted = sum(sum(r.accepted_per_block) for r in runs["M"][1])
    figures["energy_j_per_token_ar"] = energy["ar"] / sum(map(len, ids["ar"]))
    figures["energy_j_per_token_sd_M"] = energy["M"] / sum(map(len, ids["M"]))
    figures["energy_j_per_accepted_token_sd_M"] = energy["M"] / accepted if accepted else "none accepted"
    yield from figures.items()


def batch_figures(args: argparse.Namespace, target, draft) -> Figures:
    batches = args.batch_sizes
    if not batches:
        return
    options = gpu_batch.parse_args(["--shapes", args.shapes, "--max-new-tokens", str(args.max_new_tokens),
                                    "--rounds", "1", "--device", str(device_of(args))])
    for batch in batches:
        lines = gpu_batch.measure(target, draft, options, batch, max(batches), configs=("m",))
        yield f"batch_speedup_{batch}", lines[f"b{batch}_m_speedup"]
        yield f"batch_{batch}_sd_equals_ar", lines[f"b{batch}_m_equals_ar"]


@torch.inference_mode()
def ssm_section(args: argparse.Namespace) -> Figures:
    """One decode step of a Mamba2 draft beside a Llama draft's, after a long context."""
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM

    device = device_of(args)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tiny = args.shapes == "tiny"
    shape, context, vocab = (DRAFTS["68m"], 2048, 32064) if not tiny else (None, 256, 512)
    llama = LlamaConfig(vocab_size=vocab, hidden_size=64 if tiny else shape.hidden,
                        num_hidden_layers=2 if tiny else shape.layers,
                        num_attention_heads=2 if tiny else shape.heads,
                        intermediate_size=128 if tiny else shape.intermediate, max_position_embeddings=4096)
    mamba = Mamba2Config(vocab_size=vocab, hidden_size=64 if tiny else 768,
                         num_hidden_layers=2 if tiny else 24,
                         state_size=16 if tiny else 128, head_dim=16 if tiny else 64,
                         num_heads=8 if tiny else 24, expand=2, n_groups=1)
    yield "ssm_context", context
    for name, model in (("llama_draft_step_ms", LlamaForCausalLM(llama)),
                        ("ssm_step_ms", Mamba2ForCausalLM(mamba))):
        model = model.to(device, dtype).eval()
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.randint(5, vocab, (1, context), device=device), cache=cache, use_cache=True,
              logits_to_keep=1)
        token = torch.tensor([[7]], device=device)
        for _ in range(3):  # warm-up
            model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        gpu_engine.synchronize(device)
        start, steps = time.perf_counter(), 20
        for _ in range(steps):
            model(input_ids=token, cache=cache, use_cache=True, logits_to_keep=1)
        gpu_engine.synchronize(device)
        yield name, 1000 * (time.perf_counter() - start) / steps
        yield name.replace("step_ms", "params_m"), sum(p.numel() for p in model.parameters()) / 1e6
    fused = importlib.util.find_spec("mamba_ssm") is not None
    yield "ssm_kernels", "mamba_ssm" if fused else "reference (transformers' PyTorch path: no mamba_ssm)"


def synchronize_all() -> None:
    """Wait for every GPU (none on a CPU): a spread model's last layers run on the second."""
    for index in range(torch.cuda.device_count()):
        torch.cuda.synchronize(index)


def spread_section(args: argparse.Namespace) -> Figures:
    """The family's real-shaped target on the first GPU, then spread over two (its draft on the
    first, as an actor of a pair given `gpus: 2` holds them): greedy AR and SD M outputs of the
    two compared, and each one's speed."""
    from accelerate import dispatch_model

    from pipeline.models.sharding import gpu_budgets, plan_device_map

    device = device_of(args)
    target, draft = family_pair(args, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    samples, new = gpu_engine.make_samples(3), args.max_new_tokens
    config = DecodeConfig(methods="M", policy=StaticPolicy(), max_new_tokens=new)

    def timed(model) -> dict[str, tuple[float, list[list[int]]]]:
        engine = default_engine(model, draft)
        decoders = {"ar": lambda s: autoregressive_decode(model, [s], max_new_tokens=new, engine=engine)[0],
                    "sd": lambda s: speculative_decode(model, draft, [s], config, engine=engine)[0]}
        runs = {}
        for name, decode in decoders.items():
            decode(samples[0])  # warm-up: compiles and captures where the model is on one GPU
            synchronize_all()
            start = time.perf_counter()
            records = [decode(s) for s in samples]
            synchronize_all()
            runs[name] = (time.perf_counter() - start, [r.output_ids for r in records])
        return runs

    one = timed(target)
    dispatch_model(target.model, device_map=plan_device_map(target.model, gpu_budgets(2), target.name))
    spread = type(target)(target.model, target.processor, target.name)  # an adapter that sees the map
    two = timed(spread)
    yield "spread_gpus", spread.gpus
    for name in ("ar", "sd"):
        equal = sum(a == b for a, b in zip(one[name][1], two[name][1]))
        yield f"spread_{name}_equals_one_gpu", f"{equal}/{len(samples)}"
        for where, runs in (("one_gpu", one), ("spread", two)):
            yield f"{where}_{name}_tokens_per_s", sum(map(len, runs[name][1])) / runs[name][0]


SECTIONS: dict[str, Callable[[argparse.Namespace], Figures]] = {
    "head": head_section,
    "exact": exact_section,
    "decode": decode_section,
    "ssm_step": ssm_section,
    "gpu_tests": gpu_tests_section,
    "spread": spread_section,
}
