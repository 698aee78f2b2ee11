"""A decode's records: one per request before it starts, filled with its output and timings
when it ends (live decoding and the AR baseline alike)."""
from __future__ import annotations

import time
from typing import Sequence

from pipeline.data.sample import Sample
from pipeline.decoding.records import SampleRecord
from pipeline.decoding.timing import PhaseTimer
from pipeline.models.base import LVLM, StepLog


def new_records(samples: Sequence[Sample], mode: str, engine: str) -> list[SampleRecord]:
    """A record per request; `batch_requests` set when several decode together."""
    together = len(samples) if len(samples) > 1 else None
    return [SampleRecord(sample_id=s.sample_id, mode=mode, engine=engine, batch_requests=together)
            for s in samples]


def finish_records(records: list[SampleRecord], outputs: list[list[int]], target: LVLM, timer: PhaseTimer,
                   steps: StepLog) -> list[SampleRecord]:
    """Fill each record's output and the decode's timings (every request of a batch carries the
    batch's); a request's `time_request_s` was set as it stopped."""
    seconds = timer.totals()
    wall = time.perf_counter() - timer.started
    energy = timer.energy_j()
    total = seconds["prefill"] + seconds["draft"] + seconds["verify"]
    tokens = sum(len(output) for output in outputs)
    for record, output in zip(records, outputs):
        record.steps = steps.summary
        record.fallback = "; ".join(sorted(steps.fallbacks)) or None
        record.output_ids = output
        record.output_text = target.tokenizer.decode(output, skip_special_tokens=True)
        record.time_prefill_s = seconds["prefill"]
        record.time_draft_s = seconds["draft"]
        record.time_verify_s = seconds["verify"]
        record.time_tabed_draft_s = seconds["tabed_draft"]
        record.time_tabed_s = seconds["tabed_draft"] + seconds["tabed"]
        record.time_vision_s = seconds["target_vision"] + seconds["draft_vision"]
        record.time_target_prefill_s = seconds["target_prefill"]
        record.time_draft_prefill_s = seconds["draft_prefill"]
        record.time_total_s = total
        record.time_wall_s = wall
        if len(records) == 1:
            record.time_request_s = wall
        record.batch_tokens_per_s = tokens / total if total > 0 else None
        if energy is not None:
            record.energy_j = energy * (len(output) / tokens if tokens else 1 / len(records))
    return records
