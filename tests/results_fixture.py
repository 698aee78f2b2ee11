"""A results folder shaped like the default job's, written without decoding: one target with two
drafts, chains and candidate trees of the same ensembles, a first and a second turn, an OOD
scenario, timed live rows and a calibration per pair. Accepted counts are seeded, so every
table the report draws from it is fixed; what the code under test does with them is real."""
from __future__ import annotations

import random
from pathlib import Path

from pipeline.decoding.config import DecodeConfig
from pipeline.data.sample import Sample
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.verify_kinds import CandidateTree
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy
from pipeline.planning.grid import Pair, RunConfig
from pipeline.decoding.calibration import Calibration
from pipeline.storage.calibration_store import Calibrations, write_calibration
from pipeline.storage.schema import make_row
from pipeline.storage.manifest import write_manifest
from pipeline.storage.store import rows_to_table, write_shards

RUN = "embedded"
TARGET = "embedded:target"
SMALL, LARGE = Pair(TARGET, "embedded:small_draft"), Pair(TARGET, "embedded:draft")
DATASETS = {"embedded_vqa": "benchmark", "embedded_describe": "benchmark", "embedded_story": "ood"}
TURNS = ("first", "qaorg")
SAMPLES = 3
TIMED = "embedded_vqa/test/0/first"  # the one timed sample of the small draft
ENVIRONMENT = {"device_name": "cpu: test CPU (2 threads)", "torch_version": "2.13.0", "transformers_version": "5.24.0",
               "cpu_cores": 2}


def configs(pair: Pair) -> list[RunConfig]:
    """The default job's: AR and the paper's eight configurations as chains, and the four
    ensembles as candidate trees too."""
    ensembles = [RunConfig(pair, DecodeConfig("MT")), RunConfig(pair, DecodeConfig("MTCP")), RunConfig(pair, DecodeConfig("MT", GridSearchPolicy())),
                 RunConfig(pair, DecodeConfig("MTCP", InverseErrorPolicy()))]
    singles = [RunConfig(pair, DecodeConfig("AR", gamma=None))] + [RunConfig(pair, DecodeConfig(m)) for m in "MTCP"]
    trees = [RunConfig(c.pair, DecodeConfig(c.decode.methods, c.decode.policy, verify=CandidateTree())) for c in ensembles]
    return singles + ensembles + trees


def record(config: RunConfig, sample: Sample, rng: random.Random, *, live: bool, seconds: float) -> SampleRecord:
    """A plausible outcome: blocks of up to gamma accepted proposals, 24 tokens in all."""
    accepted, emitted = [], 0
    while emitted < 24:
        n = 0 if config.decode.is_ar else min(rng.randint(0, 5), 23 - emitted)
        accepted.append(n)
        emitted += n + 1
    methods = 0 if config.decode.is_ar else len(config.decode.methods)
    weights = [[round(1 / methods, 6)] * methods for _ in accepted] if methods else []
    mode = "ar" if config.decode.is_ar else "live" if live else "replay"
    return SampleRecord(sample.sample_id, mode=mode, engine="static", accepted_per_block=accepted,
                        weights_per_block=weights, output_ids=list(range(3, 3 + emitted)),
                        output_text="a red circle", time_total_s=seconds if live or config.decode.is_ar else 0.0)


def write_results(out: Path, *, calibrate: bool = True, timed_load: float = 0.5) -> Path:
    """Write the fixture's rows, manifest and calibrations under `out`; returns `out`. Live and
    AR decodes record `timed_load` as the machine's load before and after them."""
    rng = random.Random(0)
    rows = []
    for pair in (SMALL, LARGE):
        for dataset, category in DATASETS.items():
            for turn in TURNS:
                for row in range(SAMPLES):
                    sample = Sample(dataset, "test", row, turn, f"USER: <image>\nq{row} ASSISTANT:", category=category)
                    timed = pair == SMALL and sample.sample_id == TIMED and turn == "first"
                    for config in configs(pair):
                        live = timed and not config.decode.is_ar and config.decode.verify.is_chain
                        seconds = 2.0 if config.decode.is_ar else 1.0 + 0.1 * len(config.decode.methods)
                        made = record(config, sample, rng, live=live, seconds=seconds)
                        if made.mode != "replay":
                            made.load_before = made.load_after = timed_load
                        rows.append(make_row(RUN, f"{dataset}-{turn}", config, sample, made, timed, ENVIRONMENT))
    for shard in dict.fromkeys(row["shard"] for row in rows):
        write_shards(out, rows_to_table([row for row in rows if row["shard"] == shard]))
    expected = {}
    for row in rows:
        key = (row["target"], row["draft"], row["dtype"], row["turn"])
        expected[key] = expected.get(key, 0) + 1
    write_manifest(out, RUN, {"grid": RUN, "expected": [dict(zip(("target", "draft", "dtype", "turn"), k), rows=n)
                                                          for k, n in expected.items()]})
    if calibrate:
        for pair, ratio in ((SMALL, 0.04), (LARGE, 0.98)):
            write_calibration(out, calibration(pair, ratio))
    return out


QUIET, LOADED = (0.9, 0.95, 1.0, 1.05, 1.1), (0.175, 0.5, 1.0, 4.0, 12.7)  # each round / the median


def calibration(pair: Pair, ratio: float, rounds: tuple[float, ...] = QUIET, measured_at: str = "2026-11-25T00:00:00+00:00",
                load: float = 0.5) -> Calibration:
    """A calibration of `pair` whose rounds of every ratio are the median times `rounds`,
    timing chains and the candidate trees of MT and MTCP; `load` before and after. LOADED is
    the loaded machine of the first-hour report: Tq/Tp 0.007-0.509 around 0.04."""
    round_of = lambda value: [value * factor for factor in rounds]
    counts, tokens = [1, 2, 3, 4, 6, 20], [6, 16, 26]
    rows_ratio, verify = [ratio * (1 + 0.2 * (m - 1)) for m in counts], [1.6, 1.9, 2.5]
    return Calibration(
        target=pair.target, draft=pair.draft, device="cpu", dtype="fp32", gamma=5, target_token_s=0.05,
        target_verify_s=0.08, draft_token_s=0.05 * ratio, draft_rows_token_s=[0.05 * r for r in rows_ratio], repeats=10,
        engine="static", rounds=5, ratio_draft_target_rounds=round_of(ratio), ratio_verify_rounds=round_of(1.6),
        draft_rows_ratio=rows_ratio, measured_at=measured_at, device_name="cpu: test CPU (2 threads)",
        verify_tokens=tokens, verify_s=[0.05 * v for v in verify], verify_ratios=verify, draft_row_counts=counts,
        verify_ratio_rounds=[round_of(v) for v in verify], draft_rows_ratio_rounds=[round_of(r) for r in rows_ratio],
        load_before=load, load_after=load, cpu_cores=2,
    )


def calibrations_of(rows: list[dict]) -> Calibrations:
    """Calibrations from rows that give only what a test needs: the headline ratios
    (`ratio_draft_target`, `ratio_verify`) and any other stored column; Tp defaults to 10 ms and
    the rest of a file's fields are filled to match (one round each)."""
    def complete(row: dict) -> dict:
        tp = row.get("target_token_s", 0.01)
        return {"device": "cpu", "repeats": 1, "draft_rows_token_s": [], "target_token_s": tp,
                "draft_token_s": row["ratio_draft_target"] * tp, "target_verify_s": row["ratio_verify"] * tp} | row
    return Calibrations([Calibration.from_row(complete(row)) for row in rows])
