"""Where SD stops paying as the batch grows: AR and greedy SD (M, MT* and MTCP* chains, the MT*
candidate tree) at batch 1, 2, 4 and 8, side by side in one run with transformers' own batched
`generate` for AR.

The same samples are decoded at every batch size (ceil(samples / B) batches of B), so each
batch size does the same work; tokens/s counts every request's new tokens over the summed
walltime of its batches. Every decoder runs `--rounds` times per batch size, in turn, and its
fastest round is kept (noise on a shared machine only ever adds time). SD's speedup is over our
AR at the same batch; `ours_vs_hf_ar` is our batched AR tokens/s over `generate`'s (both greedy,
from the image on: prompt embeddings computed inside each timing, left-padded), and
`*_equals_ar` counts the requests whose output equals AR's at that batch. Last lines are
`name=value`.

    python bench/record.py bench/batch.py                     # the embedded pair, 8 samples
    python bench/record.py --label ar-vs-generate bench/batch.py --sd --rounds 5   # AR alone
    python bench/batch.py --batches 1 2 4 --samples 4 --max-new-tokens 24
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.trees import embedded_case, timed  # noqa: E402
from pipeline.decoding.batch_loop import autoregressive_decode_batch, speculative_decode_batch  # noqa: E402
from pipeline.decoding.config import DecodeConfig  # noqa: E402
from pipeline.decoding.rows import left_padded  # noqa: E402
from pipeline.drafting.methods import method_embeddings  # noqa: E402
from pipeline.decoding.verify_kinds import CandidateTree  # noqa: E402
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy  # noqa: E402


SD_CONFIGS = {"M": DecodeConfig("M"), "MT*": DecodeConfig("MT", GridSearchPolicy()),
              "MTCP*": DecodeConfig("MTCP", InverseErrorPolicy(temperature=1.0)),
              "MT* (candidates)": DecodeConfig("MT", GridSearchPolicy(), verify=CandidateTree())}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    parser.add_argument("--rounds", type=int, default=2, help="timings per decoder and batch size (fastest kept)")
    parser.add_argument("--sd", nargs="*", default=list(SD_CONFIGS), choices=list(SD_CONFIGS),
                        help="SD configurations to time (none: our AR against generate only)")
    return parser.parse_args(argv)


def hf_generate(target, samples, max_new_tokens: int) -> list[list[int]]:
    """transformers' batched greedy `generate` on the same prompt embeddings our rows prefill,
    left-padded with an attention mask; each request cut after its first EOS as ours are."""
    embeds = [method_embeddings(target, "M", target.tokenize_prompt(s.prompt), s.images) for s in samples]
    batch, padding = left_padded(embeds)
    out = target.model.generate(inputs_embeds=batch, attention_mask=padding.long(), max_new_tokens=max_new_tokens,
                                do_sample=False, pad_token_id=target.tokenizer.pad_token_id or 0)
    cut = []
    for row in out.tolist():
        stop = next((i for i, t in enumerate(row) if t in target.eos_token_ids), None)
        cut.append(row if stop is None else row[: stop + 1])
    return cut


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    target, draft, captioner, samples = embedded_case(argparse.Namespace(samples=args.samples))
    configs = {name: replace(SD_CONFIGS[name], gamma=args.gamma, max_new_tokens=args.max_new_tokens)
               for name in args.sd}
    ids = lambda records: [r.output_ids for r in records]
    runs = {"ar": lambda b: ids(autoregressive_decode_batch(target, b, max_new_tokens=args.max_new_tokens)),
            "hf_ar": lambda b: hf_generate(target, b, args.max_new_tokens),
            **{name: (lambda b, c=config: ids(speculative_decode_batch(target, draft, b, c, captioner)))
               for name, config in configs.items()}}
    for run in runs.values():  # warm-up
        run(samples[:2])
    out: dict[str, float] = {}
    for batch in args.batches:
        groups = [samples[i : i + batch] for i in range(0, len(samples), batch)]
        seconds, outputs = {}, {}
        for _ in range(args.rounds):
            for name, run in runs.items():
                took = [timed(lambda g=group: run(g), target.device) for group in groups]
                seconds[name] = min(seconds.get(name, float("inf")), sum(t for t, _ in took))
                outputs[name] = [o for _, done in took for o in done]
        tokens = sum(len(o) for o in outputs["ar"])
        out[f"b{batch}_ar_tokens_per_s"] = tokens / seconds["ar"]
        out[f"b{batch}_hf_ar_tokens_per_s"] = sum(len(o) for o in outputs["hf_ar"]) / seconds["hf_ar"]
        out[f"b{batch}_ours_vs_hf_ar"] = out[f"b{batch}_ar_tokens_per_s"] / out[f"b{batch}_hf_ar_tokens_per_s"]
        out[f"b{batch}_hf_ar_equals_ar"] = sum(a == h for a, h in zip(outputs["ar"], outputs["hf_ar"]))
        for name in configs:
            key = name.replace("*", "_star").replace(" (candidates)", "_candidates")
            out[f"b{batch}_{key}_tokens_per_s"] = sum(len(o) for o in outputs[name]) / seconds[name]
            out[f"b{batch}_{key}_speedup"] = seconds["ar"] / seconds[name]
            out[f"b{batch}_{key}_equals_ar"] = sum(a == s for a, s in zip(outputs["ar"], outputs[name]))
    print(f"# embedded pair on {target.device}, {len(samples)} samples x {args.max_new_tokens} new tokens, "
          f"gamma {args.gamma}, batches {args.batches}, fastest of {args.rounds} rounds, {args.threads} threads")
    for name, value in out.items():
        print(f"{name}={value}" if isinstance(value, int) else f"{name}={value:.6g}")
    return out


if __name__ == "__main__":
    main()
