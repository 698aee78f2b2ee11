"""Token trees against chains, measured side by side: tau, tokens/s and what a block costs.

    python bench/trees.py                                # the embedded CPU pair (small draft), 4 samples
    python bench/trees.py --pair 7b --draft 68m          # GPU: real-shaped LLaVA pair (bench/real_shapes.py)

For each verify kind (chain, candidates, dynamic) and drafting configuration (M, MT*, MTCP*),
every sample is decoded live, round-robin with our AR baseline on the same engine so that
background load hits them alike; outputs are checked against AR (greedy: they must be
equal). Output, `name=value` (`<kind>` is chain, candidates or dynamic; `<config>` m,
mt_star or mtcp_star):
- ar_tokens_per_s; <kind>_<config>_tokens_per_s, _tau, _speedup (AR time / SD time),
  _block_ms (draft + verify per block), _verify_ms (the target's part per block),
  _draft_ms (the draft's part, TABED included);
- <kind>_<config>_equals_ar: samples whose output equals AR's;
- verify_tokens_<kind>_<config>: tokens in the block's target forward (chain: gamma + 1).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain copy of the repo

from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.loop import autoregressive_decode, speculative_decode  # noqa: E402
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy, StaticPolicy  # noqa: E402
from pipeline.planning.verify_entries import make_verify  # noqa: E402

VERIFY = {"chain": "chain", "candidates": "candidates",
          "dynamic": {"kind": "dynamic", "nodes": 16, "top_k": 4}}
CONFIGS = {"m": ("M", StaticPolicy()), "mt_star": ("MT", GridSearchPolicy()),
           "mtcp_star": ("MTCP", InverseErrorPolicy())}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=["embedded", "7b", "13b"], default="embedded")
    parser.add_argument("--draft", choices=["68m", "160m"], default="68m", help="draft shape (7b/13b)")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (the embedded pair)")
    return parser.parse_args(argv)


def embedded_case(args: argparse.Namespace):
    """The embedded target and its small draft, the captioner, and first-turn samples spread
    over the four embedded scenarios."""
    from pipeline.data import load_samples
    from pipeline.models.embedded import load_embedded, load_embedded_captioner

    datasets = ["embedded_vqa", "embedded_describe", "embedded_compare", "embedded_story"]
    per = -(-args.samples // len(datasets))
    samples = [s for d in datasets for s in load_samples(d, limit=per)][: args.samples]
    target, draft = load_embedded("target"), load_embedded("small_draft")
    return target, draft, load_embedded_captioner(), samples


def shaped_case(args: argparse.Namespace):
    """A LLaVA-1.5-shaped pair with arranged random weights (bench/real_shapes.py) in bf16."""
    from bench.gpu_engine import ColourCaptioner, make_samples
    from bench.real_shapes import build_pair, pair_shape

    target, draft = build_pair(pair_shape(args.pair, args.draft), 0.7, torch.device("cuda"), torch.bfloat16)
    return target, draft, ColourCaptioner(), make_samples(args.samples)


def timed(fn, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # the log is the name=value lines
    if args.pair == "embedded":
        torch.set_num_threads(args.threads)
        target, draft, captioner, samples = embedded_case(args)
    else:
        target, draft, captioner, samples = shaped_case(args)
    device = target.device
    runs = {(kind, name): replace(DecodeConfig(methods=methods, policy=policy, gamma=args.gamma,
                                               max_new_tokens=args.max_new_tokens),
                                  verify=make_verify(VERIFY[kind]))
            for kind in VERIFY for name, (methods, policy) in CONFIGS.items()}
    ar = lambda s: autoregressive_decode(target, [s], max_new_tokens=args.max_new_tokens)[0]
    ar(samples[0])  # warm-up (and compiles, on a GPU)
    for config in runs.values():
        speculative_decode(target, draft, [samples[0]], config, captioner)[0]
    seconds = {key: 0.0 for key in [("ar", "")] + list(runs)}
    records: dict[tuple, list] = {key: [] for key in seconds}
    for sample in samples:
        for key in seconds:
            fn = ((lambda: ar(sample)) if key[0] == "ar"
                  else (lambda: speculative_decode(target, draft, [sample], runs[key], captioner)[0]))
            took, record = timed(fn, device)
            seconds[key] += took
            records[key].append(record)
    tokens = lambda key: sum(r.new_tokens for r in records[key])
    out: dict[str, float] = {"ar_tokens_per_s": tokens(("ar", "")) / seconds[("ar", "")]}
    for (kind, name), config in runs.items():
        mine, prefix = records[(kind, name)], f"{kind}_{name}"
        blocks = sum(r.blocks for r in mine)
        out[f"{prefix}_tokens_per_s"] = tokens((kind, name)) / seconds[(kind, name)]
        out[f"{prefix}_tau"] = 1 + sum(sum(r.accepted_per_block) for r in mine) / blocks
        out[f"{prefix}_speedup"] = seconds[("ar", "")] / seconds[(kind, name)]
        out[f"{prefix}_block_ms"] = 1000 * sum(r.time_draft_s + r.time_verify_s for r in mine) / blocks
        out[f"{prefix}_verify_ms"] = 1000 * sum(r.time_verify_s for r in mine) / blocks
        out[f"{prefix}_draft_ms"] = 1000 * sum(r.time_draft_s for r in mine) / blocks
        out[f"{prefix}_equals_ar"] = sum(r.output_ids == a.output_ids
                                         for r, a in zip(mine, records[("ar", "")]))
        out[f"verify_tokens_{prefix}"] = config.verify.tree_nodes(config.gamma, len(config.methods)) + 1
    print(f"# {args.pair} pair on {device}, {len(samples)} samples x {args.max_new_tokens} new tokens, "
          f"gamma {args.gamma}; AR {tokens(('ar', ''))} tokens in {seconds[('ar', '')]:.2f} s")
    for name, value in out.items():
        print(f"{name}={value}" if isinstance(value, int) else f"{name}={value:.6g}")
    return out


if __name__ == "__main__":
    main()
