"""SD over AR at the same batch size on the real-shaped LLaVA pair (`bench/real_shapes.py`), the
GPU counterpart of `bench/batch.py` (which times the embedded pair on a CPU).

    python bench/record.py bench/gpu_batch.py --shapes 7b --draft 68m --batches 1 4 16
    python bench/gpu_batch.py --shapes tiny --batches 1 2 --max-new-tokens 16     # CPU smoke

The same `max(batches)` requests are decoded at every batch size, `ceil(n / B)` batches of B, by
our AR and by SD (M, and MT* with grid weights); each decoder is warmed up once per batch size
(compiles and captures happen then) and its fastest of `--rounds` timed passes is kept.

Lines, `name=value`: `b<B>_ar_tokens_per_s`, `b<B>_<key>_tokens_per_s`, `b<B>_<key>_speedup` (SD
over AR at batch B), `b<B>_<key>_equals_ar` (requests whose SD output equals AR's at that batch;
bf16 may legitimately differ), `b<B>_<key>_tau` (1 + accepted per block).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain copy of the repo

from bench.gpu_engine import ColourCaptioner, make_samples, synchronize  # noqa: E402
from bench.real_shapes import build_pair, pair_shape  # noqa: E402
from pipeline.data.sample import Sample  # noqa: E402
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.engine import default_engine  # noqa: E402
from pipeline.decoding.loop import autoregressive_decode, speculative_decode  # noqa: E402
from pipeline.decoding.records import SampleRecord  # noqa: E402
from pipeline.drafting.policies import GridSearchPolicy, StaticPolicy  # noqa: E402
from pipeline.models.dtypes import DTYPES, resolve_dtype  # noqa: E402

SD_CONFIGS = {"m": ("M", StaticPolicy), "mt_star": ("MT", GridSearchPolicy)}
Decode = Callable[[list[Sample]], list[SampleRecord]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=["tiny", "7b", "13b"], default="tiny")
    parser.add_argument("--draft", choices=["68m", "160m"], default="68m")
    parser.add_argument("--agreement", type=float, default=0.7)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine", choices=["static", "eager"], help="default: the engine's own choice")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="default: bf16 on cuda, fp32 on cpu")
    args = parser.parse_args(argv)
    args.device = torch.device(args.device)
    args.dtype = resolve_dtype(args.dtype or ("bf16" if args.device.type == "cuda" else "fp32"))
    return args


def fastest(decode: Decode, samples: list[Sample], batch: int, rounds: int,
            device: torch.device) -> tuple[float, list[SampleRecord]]:
    """Seconds of the fastest pass over `samples` in batches of `batch`, and its records."""
    groups = [samples[i : i + batch] for i in range(0, len(samples), batch)]
    decode(groups[0])  # warm-up: compiles and captures this batch size's steps
    best, records = float("inf"), []
    for _ in range(rounds):
        synchronize(device)
        start = time.perf_counter()
        records = [record for group in groups for record in decode(group)]
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best, records


def measure(target, draft, args: argparse.Namespace, batch: int, requests: int,
            configs: tuple[str, ...] = tuple(SD_CONFIGS)) -> dict[str, float]:
    """One batch size's lines: `requests` requests decoded in batches of `batch` by our AR and by
    each SD configuration in `configs`."""
    samples, new = make_samples(requests), args.max_new_tokens
    engine = args.engine or default_engine(target, draft)
    ar_s, ar = fastest(lambda group: autoregressive_decode(target, group, max_new_tokens=new, engine=engine),
                       samples, batch, args.rounds, args.device)
    tokens = sum(r.new_tokens for r in ar)
    lines = {f"b{batch}_ar_tokens_per_s": tokens / ar_s}
    for key in configs:
        methods, policy = SD_CONFIGS[key]
        config = DecodeConfig(methods=methods, policy=policy(), gamma=args.gamma, max_new_tokens=new)
        sd_s, sd = fastest(lambda group: speculative_decode(target, draft, group, config, ColourCaptioner(),
                                                            engine=engine),
                           samples, batch, args.rounds, args.device)
        blocks = sum(r.blocks for r in sd)
        lines[f"b{batch}_{key}_tokens_per_s"] = sum(r.new_tokens for r in sd) / sd_s
        lines[f"b{batch}_{key}_speedup"] = ar_s / sd_s * sum(r.new_tokens for r in sd) / tokens
        lines[f"b{batch}_{key}_equals_ar"] = sum(s.output_ids == a.output_ids for s, a in zip(sd, ar))
        lines[f"b{batch}_{key}_tau"] = 1 + sum(sum(r.accepted_per_block) for r in sd) / blocks
    return lines


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    target, draft = build_pair(pair_shape(args.shapes, args.draft), args.agreement, args.device, args.dtype)
    requests = max(args.batches)
    print(f"# {args.shapes}/{args.draft if args.shapes != 'tiny' else 'tiny'} on {args.device} as "
          f"{str(args.dtype).removeprefix('torch.')}, engine {args.engine or default_engine(target, draft)}, "
          f"{requests} requests x {args.max_new_tokens} new tokens, gamma {args.gamma}, "
          f"fastest of {args.rounds}", flush=True)
    metrics: dict[str, float] = {}
    for batch in args.batches:
        lines = measure(target, draft, args, batch, requests)
        for name, value in lines.items():  # each batch size as soon as it is done
            print(f"{name}={value}" if isinstance(value, int) else f"{name}={value:.6g}", flush=True)
        metrics.update(lines)
    return metrics


if __name__ == "__main__":
    main()
