"""Replay vs the live engine on the tiny LLaVA pair, with real numerics.

Live and replay compute the same positions in different chunk shapes, which in fp32 round
differently (~1e-5 in logits on a CPU). The comparison stays exact; any difference must be
explained by a measured near-tie (reported with its log-probability gap) or, for the continuous
inverse-error weights, by a rounding difference of a few 1e-6, and is reported as a warning,
never hidden. A second test runs the models in fp64 (logits still handed over in fp32), where
rounding noise vanishes, and requires equality with no explanation allowed.
"""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, replace

import pytest
import torch
from PIL import Image

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.planning.verify_entries import make_verify
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.decoding.loop import speculative_decode
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.replay import Traces, replay
from pipeline.decoding.traces import collect_traces
from pipeline.drafting.scoring import DISTANCE_FUNCTIONS, mix
from pipeline.models.loading import load_pair
from tests.conftest import FixedCaptioner, solid

MAX_NEW = 24
RUNS_PER_PROMPT = 12
TIE_LOG_GAP = 1e-3  # fp32 chunk-shape noise is ~3e-5 in logits here; ties below this are reported
INVERSE_WEIGHT_NOISE = 1e-5  # inverse-error weights are continuous: fp32 noise shows at 6 decimals

CONFIGS = [DecodeConfig(methods=m) for m in ("M", "T", "C", "P", "MT", "MTC", "MTP", "MTCP")]
CONFIGS += [
    DecodeConfig(methods="MT", policy=GridSearchPolicy(measure=measure, distance=distance))
    for measure, distance in (("hard", "kl"), ("soft", "kl"), ("hard+soft", "kl"), ("soft", "tvd"))
]
CONFIGS += [DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(distance=d)) for d in ("kl", "tvd")]
CANDIDATES = make_verify("candidates")  # the replayable tree: each method's chain and the ensembled one
CONFIGS += [DecodeConfig(methods="MT", verify=CANDIDATES), DecodeConfig(methods="MTCP", verify=CANDIDATES),
            DecodeConfig(methods="MT", policy=GridSearchPolicy(), verify=CANDIDATES),
            DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(), verify=CANDIDATES)]
COMBOS = [replace(c, gamma=g, max_new_tokens=MAX_NEW) for c in CONFIGS for g in (1, 3, 5)]

_QUESTIONS = [
    "What is in this image?", "Describe the picture in detail.", "How many circle are there?",
    "What color is the square on the left?", "Explain the difference.", "Please write a story.",
]


def _noise(seed: int, size=(56, 56)) -> Image.Image:
    rng = random.Random(seed)
    return Image.frombytes("RGB", size, bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3)))


def make_samples(count: int) -> list[Sample]:
    samples = []
    for row in range(count):
        question = _QUESTIONS[row % len(_QUESTIONS)]
        image = _noise(row) if row % 2 else solid((37 * row % 256, 90, 255 - 23 * row % 256))
        if row % 6 == 4:
            prompt, images = f"USER: Source: <image> Target: <image> {question} ASSISTANT:", (image, _noise(50 + row, (40, 70)))
        elif row % 8 == 7:
            prompt, images = f"USER: {question} ASSISTANT:", ()
        else:
            prompt, images = f"USER: <image>\n{question} ASSISTANT:", (image,)
        samples.append(Sample("tiny", "test", row, "first", prompt, images))
    return samples


def log_gap(probs: torch.Tensor) -> float:
    """log(top-1) - log(top-2) of a distribution: how far its argmax is from a tie."""
    top = probs.double().topk(2).values
    return float(top[0].log() - top[1].log())


@dataclass
class Comparison:
    """Live vs replay for one run: exact agreement up to `blocks`, then what differed."""

    blocks: int
    weight_noise: float = 0.0  # largest inverse-weight difference seen (fp32 rounding)
    divergence: str | None = None  # first difference in accepted counts / grid weights / output
    near_tie: bool = True


def history_window(trace: Traces, config: DecodeConfig, accepted: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """`q [H, m, V]`, `p [H, V]` at the history positions the policy's window sees after
    blocks with these accepted counts."""
    rows = [trace.methods.index(m) for m in config.methods]
    positions, t = [], 0
    for a in accepted:
        positions.extend(range(t, t + min(a + 1, config.gamma)))
        t += a + 1
    if config.policy.window is not None:
        positions = positions[-config.policy.window:]
    return trace.draft_probs[positions][:, rows], trace.target_probs[positions]


def explain_grid_flip(trace, config, accepted, w_live, w_replay) -> tuple[str, bool]:
    """Two grid candidates swapped: compare their hit counts and summed distances."""
    q, p = history_window(trace, config, accepted)
    distance = "kl" if config.policy.measure == "hard+soft" else config.policy.distance
    scores = []
    for w in (w_live, w_replay):
        mixed = mix(q, torch.tensor(w, dtype=torch.float64))
        scores.append((int((mixed.argmax(-1) == p.argmax(-1)).sum()), float(DISTANCE_FUNCTIONS[distance](p, mixed).sum())))
    (h1, d1), (h2, d2) = scores
    min_gap = min(log_gap(mix(q[i], torch.tensor(w_replay, dtype=torch.float64))) for i in range(len(q)))
    relative = abs(d1 - d2) / max(d1, d2, 1e-30)
    tie = (h1 == h2 and relative < TIE_LOG_GAP) or (h1 != h2 and min_gap < TIE_LOG_GAP)
    return f"grid weights {w_live} (live) vs {w_replay}: hits {h1}/{h2}, distance {d1:.6g}/{d2:.6g}, smallest mixed log-gap {min_gap:.2e}", tie


def compare(trace: Traces, config: DecodeConfig, live: SampleRecord, replayed: SampleRecord) -> Comparison:
    result = Comparison(blocks=0)
    rows = [trace.methods.index(m) for m in config.methods]
    t = 0
    for b, (a_live, a_rep) in enumerate(zip(live.accepted_per_block, replayed.accepted_per_block)):
        w_live, w_rep = live.weights_per_block[b], replayed.weights_per_block[b]
        if w_live != w_rep:
            diff = max(abs(x - y) for x, y in zip(w_live, w_rep))
            if config.policy.kind == "inverse" and diff <= INVERSE_WEIGHT_NOISE:
                result.weight_noise = max(result.weight_noise, diff)
            elif config.policy.kind == "grid":
                result.divergence, result.near_tie = explain_grid_flip(trace, config, live.accepted_per_block[:b], w_live, w_rep)
                return result
            else:
                result.divergence, result.near_tie = f"block {b}: weights {w_live} (live) vs {w_rep}", False
                return result
        if a_live != a_rep:
            s = t + min(a_live, a_rep)
            mixed = mix(trace.draft_probs[s, rows], torch.tensor(w_rep, dtype=torch.float64))
            gaps = log_gap(mixed), log_gap(trace.target_probs[s])
            result.divergence = f"block {b}: accepted {a_live} (live) vs {a_rep} at position {s}; log-gap mixed draft {gaps[0]:.2e}, target {gaps[1]:.2e}"
            result.near_tie = min(gaps) < TIE_LOG_GAP
            return result
        result.blocks += 1
        t += a_live + 1
    if live.accepted_per_block != replayed.accepted_per_block or live.output_ids != replayed.output_ids:
        first = next((i for i, (a, b) in enumerate(zip(live.output_ids, replayed.output_ids)) if a != b), None)
        gap = log_gap(trace.target_probs[first]) if first is not None else float("inf")
        result.divergence = f"outputs differ at token {first} (target log-gap {gap:.2e}) or in length"
        result.near_tie = gap < TIE_LOG_GAP
    return result


@pytest.mark.slow
def test_replay_matches_live_on_tiny_fp32_models(tiny_pair):
    """Each prompt is traced once; 12 (config, gamma) combos per prompt rotate so that every
    one of the 54 combos (candidate trees among them) runs live on 5-6 of the 24 prompts."""
    target, draft = tiny_pair
    samples = make_samples(24)
    compared, blocks, weight_noise, ties, failures = 0, 0, 0.0, [], []
    for i, sample in enumerate(samples):
        trace = collect_traces(target, draft, sample, "MTCP", FixedCaptioner(), max_new_tokens=MAX_NEW)
        for tf in trace.teacher_forced_disagreements():
            ties.append(f"{sample.sample_id}: teacher-forced target argmax differs from y at {tf} (log-gap {log_gap(trace.target_probs[tf]):.2e})")
        for j in range(RUNS_PER_PROMPT):
            config = COMBOS[(i * RUNS_PER_PROMPT + j) % len(COMBOS)]
            live = speculative_decode(target, draft, [sample], config, captioner=FixedCaptioner())[0]
            result = compare(trace, config, live, replay(trace, config))
            compared += 1
            blocks += result.blocks
            weight_noise = max(weight_noise, result.weight_noise)
            if result.divergence:
                where = (f"{sample.sample_id} {config.methods} {config.policy.label} {config.policy.distance} "
                         f"{config.verify.label} gamma={config.gamma}: {result.divergence}")
                (ties if result.near_tie else failures).append(where)
    report = f"{compared} live runs, {blocks} blocks identical; inverse weights off by at most {weight_noise:.1e}; {len(ties)} near-tie(s)"
    warnings.warn("replay vs live (tiny fp32): " + "; ".join([report] + ties))
    assert not failures, "replay differs from live beyond a near-tie:\n" + "\n".join(failures)
    assert blocks > 1000  # the comparison really ran over most blocks


@pytest.mark.slow
def test_replay_equals_live_exactly_when_models_compute_in_fp64(tiny_dirs):
    """Without rounding noise in the forwards nothing may differ, inverse weights included."""
    target, draft = load_pair(tiny_dirs["target"], tiny_dirs["draft"])
    for model in (target, draft):  # compute in fp64; the adapters still hand out fp32 logits
        model.model.double()
        model.dtype = torch.float64
    configs = [
        DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(distance="kl")),
        DecodeConfig(methods="MT", policy=GridSearchPolicy(measure="hard+soft")),
        DecodeConfig(methods="MTCP", policy=InverseErrorPolicy(distance="kl"), verify=CANDIDATES),
    ]
    for sample in make_samples(3):
        trace = collect_traces(target, draft, sample, "MTCP", FixedCaptioner(), max_new_tokens=MAX_NEW)
        for config in configs:
            for gamma in (1, 3, 5):
                config = replace(config, gamma=gamma, max_new_tokens=MAX_NEW)
                live = speculative_decode(target, draft, [sample], config, captioner=FixedCaptioner())[0]
                replayed = replay(trace, config)
                assert (replayed.accepted_per_block, replayed.weights_per_block, replayed.output_ids) == (
                    live.accepted_per_block, live.weights_per_block, live.output_ids
                ), f"{sample.sample_id} {config}"
