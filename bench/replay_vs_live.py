"""The paper's greedy drafting grid scored by live runs vs by trace replay, side by side in one run.

One model pair, one dataset: every configuration (M, T, C, P, MT, MT*, MTCP, MTCP* with their
policies) runs live on every sample, then the same grid is scored from traces collected once
per sample. Wall time and target/draft forwards are counted for both (a prefill is a forward),
and every replayed record is compared with its live twin. Last lines are `name=value`.

    python bench/replay_vs_live.py                      # tiny locally built pair, embedded data
    python bench/replay_vs_live.py --target DIR --draft DIR --dataset embedded_vqa --limit 20
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace

import torch
from PIL import Image

from pipeline.data.loading import load_samples
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import speculative_decode
from pipeline.decoding.replay import replay
from pipeline.decoding.traces import ForwardCounter, collect_traces
from pipeline.drafting.captioner import CachedCaptioner, load_captioner
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.models.loading import load_pair
from pipeline.models.tiny import build_tiny_pair


def paper_grid(gammas: list[int], max_new_tokens: int) -> dict[str, DecodeConfig]:
    """The 8 drafting configurations of paper Table 1, the dynamic ones with each policy variant."""
    configs = {m: DecodeConfig(methods=m) for m in ("M", "T", "C", "P", "MT", "MTCP")}
    for measure, distance in (("hard+soft", "kl"), ("hard", "kl"), ("soft", "kl"), ("soft", "tvd")):
        configs[f"MT*[{measure},{distance}]"] = DecodeConfig(
            methods="MT", policy=GridSearchPolicy(measure=measure, distance=distance))
    for distance in ("kl", "tvd"):
        configs[f"MTCP*[inverse,{distance}]"] = DecodeConfig(
            methods="MTCP", policy=InverseErrorPolicy(distance=distance))
    return {
        f"{name} g={gamma}": replace(config, gamma=gamma, max_new_tokens=max_new_tokens)
        for name, config in configs.items()
        for gamma in gammas
    }


class ColourCaptioner:
    """Stand-in for the caption model with tiny random models (captioning is not what is timed)."""

    def caption(self, image: Image.Image) -> str:
        r, g, b = image.convert("RGB").resize((1, 1)).getpixel((0, 0))
        return ("a red" if r >= max(g, b) else "a green" if g >= b else "a blue") + " shape"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target model (default: a tiny pair built in a temp dir)")
    parser.add_argument("--draft")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--dataset", default="embedded_describe", help="a registry dataset name")
    parser.add_argument("--limit", type=int, default=6, help="samples of the dataset")
    parser.add_argument("--gamma", type=int, nargs="+", default=[5])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--captioner", default=None, help="captioner name (default: a colour stand-in)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.target:
        args.target, args.draft = map(str, build_tiny_pair(tempfile.mkdtemp(prefix="tabed-bench-")))
    target, draft = load_pair(args.target, args.draft, dtype=args.dtype)
    captioner = load_captioner(args.captioner) if args.captioner else CachedCaptioner(ColourCaptioner())
    samples = [s for s in load_samples(args.dataset, limit=args.limit) if not s.error]
    grid = paper_grid(args.gamma, args.max_new_tokens)
    methods = "MTCP"
    counted_target, counted_draft = ForwardCounter(target), ForwardCounter(draft)

    # warm-up (lazy inits, captions) outside both timings
    speculative_decode(target, draft, [samples[0]], next(iter(grid.values())), captioner)[0]
    collect_traces(target, draft, samples[0], methods, captioner, max_new_tokens=args.max_new_tokens)

    start = time.perf_counter()
    live = {(name, s.sample_id): speculative_decode(counted_target, counted_draft, [s], config, captioner)[0]
            for s in samples for name, config in grid.items()}
    live_s = time.perf_counter() - start
    live_forwards = counted_target.forwards, counted_draft.forwards

    counted_target.forwards = counted_draft.forwards = 0
    start = time.perf_counter()
    replayed, trace_s = {}, 0.0
    for s in samples:
        traces = collect_traces(counted_target, counted_draft, s, methods, captioner,
                                max_new_tokens=args.max_new_tokens)
        trace_s += traces.time_collect_s
        for name, config in grid.items():
            replayed[(name, s.sample_id)] = replay(traces, config)
    replay_s = time.perf_counter() - start
    replay_forwards = counted_target.forwards, counted_draft.forwards

    accepted_same = sum(live[k].accepted_per_block == replayed[k].accepted_per_block for k in live)
    weights_same = sum(live[k].weights_per_block == replayed[k].weights_per_block for k in live)
    weight_gap = max(  # over blocks both runs reached: fp32 rounding shows in continuous weights
        (abs(a - b) for k in live for wl, wr in zip(live[k].weights_per_block, replayed[k].weights_per_block)
         for a, b in zip(wl, wr)), default=0.0,
    )
    print(f"pair: {args.target} / {args.draft} ({args.dtype}); dataset {args.dataset}: {len(samples)} "
          f"samples x {len(grid)} configs, max {args.max_new_tokens} tokens, gamma {args.gamma}")
    print(f"{'config':28s} {'tau live':>9s} {'tau replay':>11s}")
    for name in grid:
        taus = [(live[(name, s.sample_id)].tau, replayed[(name, s.sample_id)].tau) for s in samples]
        print(f"{name:28s} {sum(t for t, _ in taus) / len(taus):9.3f} "
              f"{sum(t for _, t in taus) / len(taus):11.3f}")
    print(f"{'':28s} {'live':>9s} {'replay':>11s}")
    print(f"{'wall s':28s} {live_s:9.2f} {replay_s:11.2f}   "
          f"(replay: {trace_s:.2f} s tracing, {replay_s - trace_s:.2f} s scoring)")
    print(f"{'target forwards':28s} {live_forwards[0]:9d} {replay_forwards[0]:11d}")
    print(f"{'draft forwards':28s} {live_forwards[1]:9d} {replay_forwards[1]:11d}")
    print(f"runs={len(live)}")
    print(f"accepted_identical_runs={accepted_same}")
    print(f"weights_identical_runs={weights_same}")
    print(f"max_weight_difference={weight_gap:.2e}")
    print(f"live_wall_s={live_s:.3f}")
    print(f"replay_wall_s={replay_s:.3f}")
    print(f"draft_forwards_live={live_forwards[1]}")
    print(f"draft_forwards_replay={replay_forwards[1]}")
    print(f"target_forwards_live={live_forwards[0]}")
    print(f"target_forwards_replay={replay_forwards[0]}")
    print(f"replay_vs_live_wall_ratio={replay_s / live_s:.4f}")


if __name__ == "__main__":
    main()
