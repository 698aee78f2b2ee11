"""Where SD stops paying as the batch grows: AR and SD at batch 1, 2, 4 and 8 on the embedded
pair, side by side in one run with transformers' own batched `generate` for AR, and with another
checkout of this repository (`--against DIR`, e.g. the main branch before a change).

Configurations: M, MT* and MTCP* chains and the MT* candidate tree (greedy), and the MT*
chain sampled at temperature 1, the MT* dynamic tree, the MT* bandit over the paper's three
shapes, and the M chain of the state-space draft (`embedded:ssm_draft`). The same samples are
decoded at every batch size (ceil(samples / B) batches of B), so each batch size does the same
work; tokens/s counts every request's new tokens over the summed walltime of its batches. Each
checkout decodes in a process of its own (`--serve`), one decode at a time, the two taking
turns; every decoder runs `--rounds` times per batch size, in turn, and its fastest round is
kept (noise on a shared machine only ever adds time). A checkout that cannot decode a
configuration at a batch size (before one decoder served every batch size: anything but greedy
chains and candidate trees of the Llama draft at batch > 1) reports it `unmeasured`.

Lines, `name=value` (`<who>`: ours, or base for `--against`; `<key>`: m, mt_star, ...):
- `<who>_b<B>_<key>_speedup`: AR time / SD time at batch B, in that checkout;
- `b<B>_<key>_sd_vs_base`, `b<B>_ar_vs_base`: base's SD (AR) time over ours (1: as fast; over 1:
  ours is faster), so that a faster AR does not read as a slower SD;
- `<who>_b<B>_<key>_tabed_share`: TABED's share (choosing weights, mixing, scoring history) of
  the SD decode's time;
- `b<B>_<key>_speedup_vs_base`: ours over base (1: as fast);
- `<who>_b<B>_<key>_equals_ar`: greedy requests whose output equals AR's at that batch; for
  the sampled chain, requests whose output equals their own batch-1 output;
- `b<B>_ar_tokens_per_s`, `b<B>_hf_ar_tokens_per_s`, `b<B>_ours_vs_hf_ar`, `b<B>_hf_ar_equals_ar`.

    python bench/record.py bench/batch.py                         # ours alone, the embedded pair
    python bench/record.py --label vs-main bench/batch.py --against ../main-before
    python bench/batch.py --batches 1 2 --samples 4 --max-new-tokens 16 --sd m mt_star
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a served checkout imports its own pipeline package, and this file's neighbours from here
sys.path.insert(0, os.environ.get("BENCH_CHECKOUT", str(ROOT)))
sys.path.insert(1, str(ROOT))

# name -> (methods, policy, verify, temperature, draft)
SD_CONFIGS = {
    "m": ("M", "static", "chain", 0.0, "small_draft"),
    "mt_star": ("MT", "grid", "chain", 0.0, "small_draft"),
    "mtcp_star": ("MTCP", "inverse", "chain", 0.0, "small_draft"),
    "mt_star_candidates": ("MT", "grid", "candidates", 0.0, "small_draft"),
    "mt_star_sampled": ("MT", "grid", "chain", 1.0, "small_draft"),
    "mt_star_dynamic": ("MT", "grid", {"kind": "dynamic", "nodes": 16, "top_k": 4}, 0.0, "small_draft"),
    "mt_star_bandit": ("MT", "grid", "bandit", 0.0, "small_draft"),
    "m_ssm": ("M", "static", "chain", 0.0, "ssm_draft"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    parser.add_argument("--rounds", type=int, default=2,
                        help="timings per decoder and batch size (fastest kept)")
    parser.add_argument("--sd", nargs="*", default=list(SD_CONFIGS), choices=list(SD_CONFIGS),
                        help="SD configurations to time (none: our AR against generate only)")
    parser.add_argument("--against", type=Path,
                        help="another checkout of this repository, timed side by side")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


class Served:
    """One checkout's decoders in a process of its own, driven one decode at a time."""

    def __init__(self, checkout: Path, args: argparse.Namespace) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--serve", "--samples", str(args.samples),
                   "--gamma", str(args.gamma), "--max-new-tokens", str(args.max_new_tokens),
                   "--threads", str(args.threads)]
        env = {**os.environ, "BENCH_CHECKOUT": str(checkout.resolve())}
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)

    def __call__(self, name: str, batch: int, start: int) -> dict:
        self.process.stdin.write(json.dumps({"name": name, "batch": batch, "start": start}) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def serve(args: argparse.Namespace) -> None:
    """Decode what the driver asks on stdin; answer seconds, outputs and TABED's time."""
    from batch_decoders import Decoders  # beside this file (the served checkout may have none)

    decoders = Decoders(args, SD_CONFIGS)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        print(json.dumps(decoders.run(ask["name"], ask["batch"], ask["start"])), flush=True)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    if args.serve:
        serve(args)
        return {}
    servers = {"ours": Served(ROOT, args)}
    if args.against:
        servers["base"] = Served(args.against, args)
    for server in servers.values():
        json.loads(server.process.stdout.readline())  # models loaded
    names = ["ar", "hf_ar", *args.sd]
    for server in servers.values():  # warm-up
        for name in names:
            server(name, 2, 0)
    best: dict[tuple, dict] = {}
    for batch in args.batches:
        for _ in range(args.rounds):
            for name in names:
                for who, server in servers.items():
                    if who == "base" and name == "hf_ar":
                        continue
                    done = [server(name, batch, start) for start in range(0, args.samples, batch)]
                    if any("unmeasured" in d for d in done):
                        best[(who, batch, name)] = {"unmeasured": done[0]["unmeasured"]}
                        continue
                    seconds = sum(d["seconds"] for d in done)
                    if seconds < best.get((who, batch, name), {}).get("seconds", float("inf")):
                        best[(who, batch, name)] = {"seconds": seconds,
                                                    "outputs": [o for d in done for o in d["outputs"]],
                                                    "tabed": sum(d["tabed_s"] for d in done),
                                                    "total": sum(d["total_s"] for d in done)}
    for server in servers.values():
        server.close()
    out = figures(best, list(servers), names, args)
    print(f"# embedded pair on cpu, {args.samples} samples x {args.max_new_tokens} new tokens, "
          f"gamma {args.gamma}, batches {args.batches}, fastest of {args.rounds} rounds, "
          f"{args.threads} threads" + (f", against {args.against}" if args.against else ""))
    for name, value in out.items():
        print(f"{name}={value}" if isinstance(value, (int, str)) else f"{name}={value:.6g}")
    return out


def figures(best: dict[tuple, dict], checkouts: list[str], names: list[str],
            args: argparse.Namespace) -> dict[str, float | int | str]:
    out: dict[str, float | int | str] = {}
    tokens = lambda outputs: sum(len(o) for o in outputs)
    for batch in args.batches:
        ar = best[("ours", batch, "ar")]
        out[f"b{batch}_ar_tokens_per_s"] = tokens(ar["outputs"]) / ar["seconds"]
        hf = best[("ours", batch, "hf_ar")]
        out[f"b{batch}_hf_ar_tokens_per_s"] = tokens(hf["outputs"]) / hf["seconds"]
        out[f"b{batch}_ours_vs_hf_ar"] = (out[f"b{batch}_ar_tokens_per_s"]
                                          / out[f"b{batch}_hf_ar_tokens_per_s"])
        out[f"b{batch}_hf_ar_equals_ar"] = sum(a == h for a, h in zip(ar["outputs"], hf["outputs"]))
        if "base" in checkouts:
            out[f"b{batch}_ar_vs_base"] = best[("base", batch, "ar")]["seconds"] / ar["seconds"]
        for name in names[2:]:
            for who in checkouts:
                sd, base_ar = best[(who, batch, name)], best[(who, batch, "ar")]
                if "unmeasured" in sd:
                    out[f"{who}_b{batch}_{name}_speedup"] = f"unmeasured ({sd['unmeasured']})"
                    continue
                out[f"{who}_b{batch}_{name}_speedup"] = base_ar["seconds"] / sd["seconds"]
                out[f"{who}_b{batch}_{name}_tabed_share"] = sd["tabed"] / sd["total"] if sd["total"] else 0.0
                reference = best[(who, 1, name)]["outputs"] if SD_CONFIGS[name][3] else base_ar["outputs"]
                out[f"{who}_b{batch}_{name}_equals_ar"] = sum(
                    a == s for a, s in zip(reference, sd["outputs"]))
            ours, base = out.get(f"ours_b{batch}_{name}_speedup"), out.get(f"base_b{batch}_{name}_speedup")
            if isinstance(ours, float) and isinstance(base, float):
                out[f"b{batch}_{name}_speedup_vs_base"] = ours / base
                seconds = lambda who: best[(who, batch, name)]["seconds"]
                out[f"b{batch}_{name}_sd_vs_base"] = seconds("base") / seconds("ours")
    return out


if __name__ == "__main__":
    main()
