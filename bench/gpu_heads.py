"""The GPU check's `head` section: a real-shaped EAGLE head (`bench.head_shapes`) on the 7B-shaped
LLaVA target, against our AR on the same target: the head's step, tau and SD speedup on a chain
and on EAGLE-2's tree at MMSpec's setting, and whether the outputs are the target's own."""
from __future__ import annotations

import argparse
import time
from typing import Iterator

import torch

from bench import gpu_engine
from bench.head_shapes import build_eagle_head
from bench.real_shapes import build_pair, pair_shape
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.engine import default_engine
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.planning.verify_entries import make_verify

Figures = Iterator[tuple[str | None, object]]
MMSPEC_TREE = {"kind": "eagle2", "depth": 3, "top_k": 8, "total_tokens": 30}


def head_section(args: argparse.Namespace) -> Figures:
    """AR, then SD with the head (chain, gamma 5; EAGLE-2's tree), each timed after one warm-up."""
    if args.family != "llava":
        yield "head", f"unmeasured (the head section has LLaVA shapes only, not {args.family}'s)"
        return
    start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target, _ = build_pair(pair_shape(args.shapes, args.draft), 0.7, device, dtype)
    head = build_eagle_head(target)
    yield "head_params_m", sum(p.numel() for p in head.model.parameters()) / 1e6
    samples, new = gpu_engine.make_samples(3), args.max_new_tokens
    engine = default_engine(target, head)
    chain = DecodeConfig("M", gamma=5, max_new_tokens=new)
    tree = DecodeConfig("M", gamma=MMSPEC_TREE["depth"] + 1, max_new_tokens=new,
                        verify=make_verify(MMSPEC_TREE))
    decoders = {"ar": lambda s: autoregressive_decode(target, [s], max_new_tokens=new, engine=engine)[0],
                "chain": lambda s: speculative_decode(target, head, [s], chain, engine=engine)[0],
                "eagle2": lambda s: speculative_decode(target, head, [s], tree, engine=engine)[0]}
    runs = {}
    for name, decode in decoders.items():
        decode(samples[0])  # compiles and captures its step shapes
        gpu_engine.synchronize(device)
        began = time.perf_counter()
        runs[name] = [decode(s) for s in samples]
        gpu_engine.synchronize(device)
        runs[name] = (time.perf_counter() - began, runs[name])
    ar_rate = sum(len(r.output_ids) for r in runs["ar"][1]) / runs["ar"][0]
    for name in ("chain", "eagle2"):
        seconds, records = runs[name]
        blocks = sum(len(r.accepted_per_block) for r in records)
        yield f"head_tau_{name}", sum(r.tau * len(r.accepted_per_block) for r in records) / blocks
        yield f"head_sd_speedup_{name}", sum(len(r.output_ids) for r in records) / seconds / ar_rate
        equal = sum(r.output_ids == a.output_ids for r, a in zip(records, runs["ar"][1]))
        yield f"head_{name}_equals_ar", f"{equal}/{len(records)}"
    chain_records = runs["chain"][1]
    steps = sum(len(r.accepted_per_block) for r in chain_records) * chain.gamma
    yield "head_step_ms", 1000 * sum(r.time_draft_s for r in chain_records) / steps
    yield "head_steps", chain_records[0].steps
    yield None, f"head done at {time.perf_counter() - start:.0f} s"
