"""bf16 on today's VLM families: how far greedy SD parts from AR where the arithmetic does not
allow equality, measured on the tiny pairs (`pipeline.models.tiny_families`), CPU or GPU.

Each family's tiny target and draft run in bf16; every prompt decodes with AR and with greedy SD
(MT chains, candidate trees, the bandit) on both engines, and each SD output is compared with
AR's: equal, or where it parts (its first differing token). fp32 is exact on the same pairs
(tests/test_today_vlms.py); bf16's 8-bit mantissa rounds a verification forward of several
tokens differently from AR's one-token forward, so ties and near-ties may part. Last lines are
`name=value`.

    python bench/families_bf16.py [--max-new 24]
"""
from __future__ import annotations

import argparse
import tempfile

import torch
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.loop import autoregressive_decode, speculative_decode
from pipeline.drafting.policies import GridSearchPolicy
from pipeline.models.loading import load_model
from pipeline.models.tiny import TINY_FAMILIES, build_family_pair
from pipeline.planning.verify_entries import make_verify

PROMPTS = [
    ("USER: <image>\nWhat is in this image? ASSISTANT:", [((200, 30, 30), (84, 112))]),
    ("USER: <image>\nDescribe the picture in detail. ASSISTANT:", [((30, 160, 90), (112, 56))]),
    ("USER: Source: <image> Target: <image> Explain the difference. ASSISTANT:",
     [((30, 30, 200), (112, 56)), ((30, 200, 30), (56, 56))]),
    ("USER: <image>\nHow many shapes are there? ASSISTANT:", [((120, 120, 20), (56, 84))]),
]
KINDS = {"chain": "chain", "candidates": "candidates",
         "bandit": {"kind": "bandit", "shapes": [[2, 2], [3, 1, 1, 1]]}}


def samples() -> list[Sample]:
    return [Sample("bf16", "bench", i, "first", text,
                   tuple(Image.new("RGB", size, colour) for colour, size in images))
            for i, (text, images) in enumerate(PROMPTS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new", type=int, default=24)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    totals = {"rows": 0, "divergent": 0}
    with tempfile.TemporaryDirectory() as root:
        for family in TINY_FAMILIES:
            target_dir, draft_dir = build_family_pair(family, f"{root}/{family}")
            target = load_model(str(target_dir), dtype="bf16", device=device)
            draft = load_model(str(draft_dir), dtype="bf16", device=device)
            rows = divergent = 0
            firsts = []
            for engine in ("static", "eager"):
                for sample in samples():
                    ar = autoregressive_decode(target, [sample], max_new_tokens=args.max_new,
                                               engine=engine)[0]
                    for kind, entry in KINDS.items():
                        config = DecodeConfig("MT", GridSearchPolicy(), gamma=4 if kind == "bandit" else 3,
                                              max_new_tokens=args.max_new, verify=make_verify(entry))
                        sd = speculative_decode(target, draft, [sample], config, engine=engine)[0]
                        rows += 1
                        if sd.output_ids != ar.output_ids:
                            divergent += 1
                            pairs = zip(sd.output_ids + [-1], ar.output_ids + [-1])
                            firsts.append(next(i for i, (a, b) in enumerate(pairs) if a != b))
            print(f"{family}: {rows} SD rows in bf16, {divergent} part from AR"
                  + (f" (first differing token at {sorted(firsts)})" if firsts else ""))
            print(f"bf16_{family}_rows={rows}")
            print(f"bf16_{family}_divergent={divergent}")
            totals["rows"] += rows
            totals["divergent"] += divergent
    print(f"device={device}")
    print(f"bf16_rows={totals['rows']}")
    print(f"bf16_divergent={totals['divergent']}")


if __name__ == "__main__":
    main()
