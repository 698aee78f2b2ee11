"""The decoders `bench/batch.py` times, served from one checkout of this repository: the embedded
target with its small and state-space drafts, our AR, transformers' `generate` and SD of each
configuration, each timed alone.

Self-contained on purpose: it runs against the checkout's own `pipeline` package, including one
from before one decoder served every batch size (`pipeline.decoding.batch_loop`), which decoded
batch 1 through its single-request loop, as its grids did, and refused at batch > 1 what that
loop did not batch.
"""
from __future__ import annotations

import argparse
import time

import torch
import transformers

from pipeline.decoding.config import DecodeConfig
from pipeline.decoding.prompt_rows import left_padded
from pipeline.drafting.methods import method_embeddings
from pipeline.drafting.policies import make_policy
from pipeline.planning.verify_entries import make_verify

DATASETS = ["embedded_vqa", "embedded_describe", "embedded_compare", "embedded_story"]


def decode_functions():
    """(AR, SD) over a list of samples, in this checkout's API."""
    try:
        from pipeline.decoding.batch_loop import autoregressive_decode_batch, speculative_decode_batch
    except ImportError:  # one decoder for every batch size
        from pipeline.decoding.loop import autoregressive_decode, speculative_decode

        return autoregressive_decode, speculative_decode
    from pipeline.decoding import loop

    def ar(target, samples, **options):
        if len(samples) == 1:
            return [loop.autoregressive_decode(target, samples[0], **options)]
        return autoregressive_decode_batch(target, samples, **options)

    def sd(target, draft, samples, config, captioner):
        if len(samples) == 1:
            return [loop.speculative_decode(target, draft, samples[0], config, captioner)]
        return speculative_decode_batch(target, draft, samples, config, captioner)

    return ar, sd


class Decoders:
    def __init__(self, args: argparse.Namespace, configs: dict[str, tuple]) -> None:
        """`configs`: name -> (methods, policy, verify entry, temperature, draft)."""
        from pipeline.data import load_samples
        from pipeline.models.embedded import load_embedded, load_embedded_captioner

        transformers.logging.disable_progress_bar()
        torch.set_num_threads(args.threads)
        per = -(-args.samples // len(DATASETS))
        self.samples = [s for d in DATASETS for s in load_samples(d, limit=per)][: args.samples]
        self.target = load_embedded("target")
        self.drafts = {name: load_embedded(name) for name in ("small_draft", "ssm_draft")}
        self.captioner = load_embedded_captioner()
        self.max_new_tokens = args.max_new_tokens
        self.configs = {name: (DecodeConfig(methods, make_policy(policy), gamma=args.gamma,
                                            temperature=temperature, max_new_tokens=args.max_new_tokens,
                                            verify=make_verify(verify)), draft)
                        for name, (methods, policy, verify, temperature, draft) in configs.items()}
        self.ar, self.sd = decode_functions()

    def run(self, name: str, batch: int, start: int) -> dict:
        samples = self.samples[start : start + batch]
        began = time.perf_counter()
        try:
            if name == "hf_ar":
                outputs, records = self.hf_generate(samples), []
            else:
                records = self.decode(name, samples)
                outputs = [r.output_ids for r in records]
        except ValueError as err:  # what this checkout cannot decode
            return {"unmeasured": str(err).split(";")[0]}
        seconds = time.perf_counter() - began
        tabed, total = (records[0].time_tabed_s, records[0].time_total_s) if records else (0.0, 0.0)
        return {"seconds": seconds, "outputs": outputs, "tabed_s": tabed, "total_s": total}

    def decode(self, name: str, samples: list) -> list:
        if name == "ar":
            return self.ar(self.target, samples, max_new_tokens=self.max_new_tokens)
        config, draft = self.configs[name]
        return self.sd(self.target, self.drafts[draft], samples, config, self.captioner)

    def hf_generate(self, samples: list) -> list[list[int]]:
        """transformers' batched greedy `generate` on the same prompt embeddings our rows
        prefill, left-padded with an attention mask; each request cut after its first EOS."""
        target = self.target
        embeds = [method_embeddings(target, "M", target.tokenize_prompt(s.prompt), s.pixels())
                  for s in samples]
        batch, padding = left_padded(embeds)
        out = target.model.generate(inputs_embeds=batch, attention_mask=padding.long(),
                                    max_new_tokens=self.max_new_tokens, do_sample=False,
                                    pad_token_id=target.tokenizer.pad_token_id or 0)
        cut = []
        for row in out.tolist():
            stop = next((i for i, t in enumerate(row) if t in target.eos_token_ids), None)
            cut.append(row if stop is None else row[: stop + 1])
        return cut
