"""A draft's step cost against the context: the state-space draft against the Llama draft of equal
size, side by side in one run. The Mamba drafters paper's point is that an SSM step does not grow
with the context (a VLM prompt carries hundreds to thousands of image tokens); an attention
draft reads a KV cache as long as the prompt.

    python bench/draft_context.py                       # the embedded drafts, CPU, 2 threads
    python bench/draft_context.py --contexts 64 512 2048 --rows 1 4 20

Both drafts run through the engine's own rows (static KV cache for the Llama, the state rows
with their per-step saved state for the Mamba2), interleaved step by step so that load hits
both alike. Untrained weights of the shipped shapes are used when a draft's weights are absent:
a step's cost does not depend on its weights. Output, `name=value`, per context L and rows r:
`llama_ms_L<L>_r<r>`, `ssm_ms_L<L>_r<r>` (median of one cached step, ms), `ssm_over_llama_L<L>_r<r>`;
then `llama_parameters`, `ssm_parameters`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import median

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain copy of the repo

from pipeline.decoding.engine import new_rows  # noqa: E402


def drafts():
    """The embedded small (Llama) and state-space (Mamba2) drafts, shipped weights or untrained."""
    from pipeline.models.embedded import EmbeddedLVLM, EmbeddedSSM, load_embedded
    from pipeline.models.embedded_parts.language import load_tokenizer
    from pipeline.models.embedded_parts.small_draft import ARCHITECTURES, OutputVocabularyHead

    target = None
    found = {}
    for variant, arch, adapter in (("small_draft", "llama", EmbeddedLVLM),
                                   ("ssm_draft", "mamba2", EmbeddedSSM)):
        try:
            found[arch] = load_embedded(variant)
        except FileNotFoundError:
            target = target or load_embedded("target")
            make_config, model_class = ARCHITECTURES[arch]
            lm = model_class(make_config(target.model.config)).eval()
            vocabulary = torch.arange(9000)  # about the shipped output vocabulary's size
            lm.lm_head = OutputVocabularyHead(lm.get_input_embeddings().weight, vocabulary)
            found[arch] = adapter(lm, load_tokenizer(), target.vision, target.projector, f"untrained {arch}")
    return found["llama"], found["mamba2"]


def rows_at(model, context: int, rows: int):
    generator = torch.Generator().manual_seed(context)
    ids = torch.randint(100, 8000, (context,), generator=generator)
    prompt = model.embed_tokens(ids)
    batch = new_rows(model, [prompt] * rows, engine="static", capacity=64, role="bench", span=4)
    batch.prefill()
    return batch


def step_ms(batch) -> float:
    start = time.perf_counter()
    batch.feed([42])
    seconds = time.perf_counter() - start
    batch.settle([0] * batch.rows)  # back to the prompt
    return 1e3 * seconds


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 20])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    llama, ssm = drafts()
    for name, model in (("llama", llama), ("ssm", ssm)):
        print(f"{name}_model={model.name}")
        print(f"{name}_parameters={sum(p.numel() for p in model.model.parameters())}")
    for context in args.contexts:
        for rows in args.rows:
            batches = {"llama": rows_at(llama, context, rows), "ssm": rows_at(ssm, context, rows)}
            times = {name: [] for name in batches}
            for step in range(args.steps + 3):  # interleaved; the first three are warm-up
                for name, batch in batches.items():
                    ms = step_ms(batch)
                    if step >= 3:
                        times[name].append(ms)
            llama_ms, ssm_ms = median(times["llama"]), median(times["ssm"])
            print(f"llama_ms_L{context}_r{rows}={llama_ms:.3f}")
            print(f"ssm_ms_L{context}_r{rows}={ssm_ms:.3f}")
            print(f"ssm_over_llama_L{context}_r{rows}={ssm_ms / llama_ms:.3f}", flush=True)


if __name__ == "__main__":
    main()
