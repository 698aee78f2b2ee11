"""Our SD engines vs transformers' greedy and assisted generation on a real-shaped LLaVA pair.

The pair is built in memory with random weights arranged so that the draft agrees with the
target on `--agreement` of tokens (`bench/real_shapes.py`): no download, no data sets, and the
shapes (hence the walltimes) of LLaVA-1.5-7B/13B with a 68M/160M draft. Each contender is
warmed up once on the first sample (compiles happen then), then all are timed round-robin on
every sample, synchronising the device before each clock read.

    python bench/gpu_engine.py --shapes tiny                    # CPU, fp32, well under a minute
    python bench/gpu_engine.py --shapes 7b --draft 68m          # GPU, bf16, both engines
    python bench/gpu_engine.py --shapes 13b --draft 160m --engine static

On a GPU box copy the repository (no install needed: the script puts the repo root on the
path); it needs only torch, transformers>=5.24 (`pip install --no-deps transformers-*.whl`
over an older one), tokenizers and pillow.

Output: a `#` header with one walltime line per contender, then `name=value` lines (`<engine>`
is static or eager; besides the metrics below they repeat samples, gamma, requested_agreement):
- copy_bandwidth_gb_s: bytes read + written per second by a large on-device tensor copy;
  floor_{target,draft}_step_ms: a decode step's weight bytes (layers, final norm, LM head) at
  that bandwidth, the memory-bound floor of one step.
- <engine>_target_step_ms: our AR time per token (decode loop, no prefill);
  <engine>_verify_block_ms: one target forward of gamma+1 tokens (SD M runs);
  <engine>_draft_step_ms_rows{1,2,4}: one draft step for M, MT, MTCP rows.
- *_tokens_per_s: new tokens over walltime of whole decodes (prefill included) for our AR,
  SD M, SD MT* (grid weights), SD MTCP* (inverse-error weights) and transformers' greedy
  (dynamic and static cache) and assisted generation (constant gamma draft tokens).
- <engine>_sd_equals_ar: samples whose SD M, MT* and MTCP* outputs all equal our AR output
  (fp32 must give all; bf16 may legitimately differ); hf_greedy_equals_ar likewise for
  transformers' greedy outputs against ours.
- <engine>_sd_m_vs_hf_assisted, <engine>_sd_m_vs_our_ar (= <engine>_measured_speedup_m),
  static_vs_eager_sd_m: tokens/s ratios.
- <engine>_tabed_overhead_share_{m,mt_star,mtcp_star}: time choosing weights, mixing and
  scoring history over draft + verify time.
- <engine>_eq1_predicted_speedup: tau / (gamma * c + 1) with c = draft_step_ms_rows1 /
  target_step_ms, beside <engine>_measured_speedup_m; <engine>_tau_m: 1 + accepted per block.
- measured_agreement: share of the target's greedy output that the draft's greedy next token
  (method M, teacher-forced on that output) predicts.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import transformers
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain copy of the repo

from bench.real_shapes import build_pair, pair_shape, step_weight_bytes  # noqa: E402
from pipeline.data.sample import Sample  # noqa: E402
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.engine import ENGINES, prefilled_rows  # noqa: E402
from pipeline.decoding.inputs import tokenize
from pipeline.decoding.loop import autoregressive_decode, speculative_decode  # noqa: E402
from pipeline.decoding.records import SampleRecord  # noqa: E402
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy, StaticPolicy  # noqa: E402
from pipeline.models.dtypes import DTYPES, resolve_dtype  # noqa: E402
from pipeline.models.hf import HFLlava  # noqa: E402

PROMPTS = [  # of equal token counts: transformers sizes its static cache by prompt + new tokens
    "USER: <image>\ndescribe this image in detail ASSISTANT:",
    "USER: <image>\nwhat do you see here ASSISTANT:",
    "USER: <image>\nwrite a story about this ASSISTANT:",
]
COLOURS = [(200, 30, 30), (30, 30, 200), (30, 180, 30)]
DRAFT_ROWS = {1: "M", 2: "MT", 4: "MTCP"}
STEP_BLOCKS = 10  # timed draft blocks of gamma steps per row count
SD_CONFIGS = {  # name: (methods, policy)
    "sd_m": ("M", StaticPolicy()),
    "sd_mt_star": ("MT", GridSearchPolicy()),
    "sd_mtcp_star": ("MTCP", InverseErrorPolicy()),
}
Decode = Callable[[Sample], "SampleRecord | list[int]"]  # one sample -> our record or transformers' new ids


class ColourCaptioner:
    """Stand-in for the caption model of method C (captioning happens before the block loop)."""

    def caption(self, image: Image.Image) -> str:
        return "a red square"


@dataclass
class Run:
    """One contender's timed decodes: walltime, tokens, outputs and (ours) records."""

    seconds: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)
    records: list[SampleRecord] = field(default_factory=list)

    def add(self, seconds: float, result: SampleRecord | list[int]) -> None:
        self.seconds += seconds
        if isinstance(result, SampleRecord):
            self.records.append(result)
            result = result.output_ids
        self.outputs.append(result)

    @property
    def tokens_per_s(self) -> float:
        return sum(len(o) for o in self.outputs) / self.seconds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=["tiny", "7b", "13b"], default="tiny")
    parser.add_argument("--draft", choices=["68m", "160m"], default="68m", help="draft shape (7b/13b)")
    parser.add_argument("--agreement", type=float, default=0.7,
                        help="share of tokens drafted as the target would")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="default: bf16 on cuda, fp32 on cpu")
    args = parser.parse_args(argv)
    args.device = torch.device(args.device)
    args.dtype = resolve_dtype(args.dtype or ("bf16" if args.device.type == "cuda" else "fp32"))
    args.engines = ENGINES if args.engine == "both" else (args.engine,)
    return args


def make_samples(n: int) -> list[Sample]:
    return [
        Sample("bench", "test", i, "first", PROMPTS[i % len(PROMPTS)],
               (Image.new("RGB", (400, 300), COLOURS[i % 3]),))
        for i in range(n)
    ]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth_gb_s(device: torch.device) -> float:
    """Bytes read + written per second by a large tensor copy: what bounds a decode step."""
    size, repeats = (2**30, 20) if device.type == "cuda" else (2**28, 5)
    src = torch.ones(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    synchronize(device)
    return 2 * size * repeats / (time.perf_counter() - start) / 1e9


@torch.inference_mode()
def draft_step_ms(draft: HFLlava, sample: Sample, methods: str, engine: str, gamma: int,
                  capacity: int) -> float:
    """One draft step for `len(methods)` rows: blocks of `gamma` one-token feeds, each block
    rolled back, as drafting does (the first block, which compiles, is not timed)."""
    prompt = tokenize(draft, sample)
    rows, _ = prefilled_rows(draft, [prompt], methods, ColourCaptioner(), engine=engine, capacity=capacity,
                             role="draft")
    token = torch.tensor([prompt.ids[-1]], device=draft.device)

    def block() -> None:
        for _ in range(gamma):
            rows.feed(token)
        rows.settle([0] * rows.rows)

    block()
    synchronize(draft.device)
    start = time.perf_counter()
    for _ in range(STEP_BLOCKS):
        block()
    synchronize(draft.device)
    return 1000 * (time.perf_counter() - start) / (STEP_BLOCKS * gamma)


@torch.inference_mode()
def draft_agreement(draft: HFLlava, sample: Sample, output: list[int]) -> int:
    """How many tokens of the target's `output` the draft's greedy next token predicts."""
    prompt = tokenize(draft, sample)
    rows, _ = prefilled_rows(draft, [prompt], "M", None, engine="eager", capacity=len(output), role="draft")
    inputs = [prompt.ids[-1], *output[:-1]]
    guesses = rows.feed(inputs, keep=len(inputs))[0].argmax(-1).tolist()
    return sum(g == t for g, t in zip(guesses, output))


def hf_generate(target: HFLlava, sample: Sample, max_new_tokens: int, **extra) -> list[int]:
    inputs = target.processor(images=list(sample.pixels()), text=[sample.prompt],
                              return_tensors="pt").to(target.device)
    inputs["pixel_values"] = inputs["pixel_values"].to(target.dtype)
    out = target.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, **extra)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def contenders(target: HFLlava, draft: HFLlava, args: argparse.Namespace) -> dict[str, Decode]:
    """Every decode to time, by output name prefix."""
    new = args.max_new_tokens
    draft.model.generation_config.num_assistant_tokens = args.gamma
    draft.model.generation_config.num_assistant_tokens_schedule = "constant"
    draft.model.generation_config.assistant_confidence_threshold = 0.0
    runs: dict[str, Decode] = {}
    for engine in args.engines:
        runs[f"{engine}_ar"] = lambda s, e=engine: autoregressive_decode(
            target, [s], max_new_tokens=new, engine=e)[0]
        for name, (methods, policy) in SD_CONFIGS.items():
            config = DecodeConfig(methods=methods, policy=policy, gamma=args.gamma, max_new_tokens=new)
            runs[f"{engine}_{name}"] = lambda s, e=engine, c=config: speculative_decode(
                target, draft, [s], c, ColourCaptioner(), engine=e
            )[0]
    runs["hf_greedy_dynamic"] = lambda s: hf_generate(target, s, new)
    runs["hf_greedy_static"] = lambda s: hf_generate(target, s, new, cache_implementation="static")
    runs["hf_assisted"] = lambda s: hf_generate(target, s, new, assistant_model=draft.model)
    return runs


def timed_runs(fns: dict[str, Decode], samples: list[Sample], device: torch.device) -> dict[str, Run]:
    """Warm every contender up on the first sample, then time them round-robin per sample so
    background load hits them alike."""
    for fn in fns.values():
        fn(samples[0])
    runs = {name: Run() for name in fns}
    for sample in samples:
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            result = fn(sample)
            synchronize(device)
            runs[name].add(time.perf_counter() - start, result)
    return runs


def tabed_share(run: Run) -> float:
    """Share of draft + verify time spent choosing weights, mixing and scoring history."""
    return (sum(r.time_tabed_s for r in run.records)
            / sum(r.time_draft_s + r.time_verify_s for r in run.records))


def engine_metrics(engine: str, runs: dict[str, Run], steps: dict[int, float],
                   gamma: int) -> dict[str, float]:
    """One engine's step times, rates, losslessness, overheads and Eq. 1 against measurement."""
    ar, m = runs[f"{engine}_ar"], runs[f"{engine}_sd_m"]
    sd = {name: runs[f"{engine}_{name}"] for name in SD_CONFIGS}
    blocks = sum(r.blocks for r in m.records)
    target_step = 1000 * sum(r.time_verify_s for r in ar.records) / sum(r.new_tokens for r in ar.records)
    tau = 1 + sum(sum(r.accepted_per_block) for r in m.records) / blocks
    speedup = m.tokens_per_s / ar.tokens_per_s
    out = {
        "target_step_ms": target_step,
        "verify_block_ms": 1000 * sum(r.time_verify_s for r in m.records) / blocks,
        **{f"draft_step_ms_rows{n}": ms for n, ms in steps.items()},
        "ar_tokens_per_s": ar.tokens_per_s,
        **{f"{name}_tokens_per_s": run.tokens_per_s for name, run in sd.items()},
        "sd_equals_ar": sum(all(run.outputs[i] == want for run in sd.values())
                            for i, want in enumerate(ar.outputs)),
        "sd_m_vs_hf_assisted": m.tokens_per_s / runs["hf_assisted"].tokens_per_s,
        "sd_m_vs_our_ar": speedup,
        **{f"tabed_overhead_share_{name.removeprefix('sd_')}": tabed_share(run) for name, run in sd.items()},
        "tau_m": tau,
        "eq1_predicted_speedup": tau / (gamma * steps[1] / target_step + 1),
        "measured_speedup_m": speedup,
    }
    return {f"{engine}_{name}": value for name, value in out.items()}


def floor_metrics(target: HFLlava, draft: HFLlava, device: torch.device) -> dict[str, float]:
    bandwidth = copy_bandwidth_gb_s(device)
    return {
        "copy_bandwidth_gb_s": bandwidth,
        "floor_target_step_ms": step_weight_bytes(target) / bandwidth / 1e6,
        "floor_draft_step_ms": step_weight_bytes(draft) / bandwidth / 1e6,
    }


def transformers_metrics(runs: dict[str, Run], ours: list[list[int]]) -> dict[str, float]:
    out: dict[str, float] = {
        "hf_greedy_equals_ar": sum(a == b for a, b in zip(runs["hf_greedy_dynamic"].outputs, ours)),
    }
    for name in ("hf_greedy_dynamic", "hf_greedy_static", "hf_assisted"):
        out[f"{name}_tokens_per_s"] = runs[name].tokens_per_s
    return out


def measured_agreement(draft: HFLlava, samples: list[Sample], outputs: list[list[int]]) -> float:
    agreed = sum(draft_agreement(draft, s, out) for s, out in zip(samples, outputs))
    return agreed / sum(len(out) for out in outputs)


def print_report(args: argparse.Namespace, pair: tuple[HFLlava, HFLlava], built_s: float,
                 runs: dict[str, Run], metrics: dict[str, float]) -> None:
    """A short header and one line per contender, then the `name=value` lines."""
    millions = [sum(p.numel() for p in model.model.parameters()) / 1e6 for model in pair]
    draft = "tiny" if args.shapes == "tiny" else args.draft
    print(f"# target {args.shapes} ({millions[0]:.1f}M params) / draft {draft} ({millions[1]:.1f}M), "
          f"built in {built_s:.1f} s on {args.device} as {str(args.dtype).removeprefix('torch.')}")
    print(f"# {args.samples} samples x {args.max_new_tokens} new tokens, gamma={args.gamma}, "
          f"requested agreement={args.agreement}; walltime of whole decodes:")
    for name, run in runs.items():
        tokens = sum(map(len, run.outputs))
        print(f"#   {name:20s} {tokens:6d} tokens in {run.seconds:8.3f} s -> "
              f"{run.tokens_per_s:9.1f} tokens/s")
    for name, value in metrics.items():
        print(f"{name}={value}" if isinstance(value, int) else f"{name}={value:.6g}")


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    if args.device.type == "cpu" and args.shapes == "tiny":
        torch.set_num_threads(1)  # tiny tensors: threads cost more than they give, and stall on a busy core
    transformers.logging.set_verbosity_error()  # assisted generation warns about its own internal call
    torch.manual_seed(0)
    start = time.perf_counter()
    target, draft = build_pair(pair_shape(args.shapes, args.draft), args.agreement, args.device, args.dtype)
    built_s = time.perf_counter() - start
    samples = make_samples(args.samples)
    capacity = args.max_new_tokens + args.gamma + 1

    metrics = floor_metrics(target, draft, args.device)
    runs = timed_runs(contenders(target, draft, args), samples, args.device)
    for engine in args.engines:
        steps = {n: draft_step_ms(draft, samples[0], m, engine, args.gamma, capacity)
                 for n, m in DRAFT_ROWS.items()}
        metrics.update(engine_metrics(engine, runs, steps, args.gamma))
    if len(args.engines) == 2:
        metrics["static_vs_eager_sd_m"] = runs["static_sd_m"].tokens_per_s / runs["eager_sd_m"].tokens_per_s
    ours = runs[f"{args.engines[0]}_ar"].outputs
    metrics.update(transformers_metrics(runs, ours))
    metrics["measured_agreement"] = measured_agreement(draft, samples, ours)
    metrics.update(samples=args.samples, gamma=args.gamma, requested_agreement=args.agreement)
    print_report(args, (target, draft), built_s, runs, metrics)
    return metrics


if __name__ == "__main__":
    main()
