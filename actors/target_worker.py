"""The Ray actor that owns one target and its drafts and turns shards into result tables.

`TargetWorker` is a plain class (testable without Ray): it loads the models, lets
`pipeline.execution.shard_records` compute a shard's records and writes them as rows.
`remote_worker` wraps it as an actor that Ray restarts when it dies (reloading its models) and
whose interrupted calls Ray retries, so a lost worker costs time but never rows.
"""
from __future__ import annotations

import os

import pyarrow as pa
import torch

from actors.model_files import resolve_model
from pipeline.data.sample import Sample
from pipeline.drafting.captioner import load_captioner
from pipeline.execution.shard_records import ShardRecords
from pipeline.models.devices import cpu_cores, device_name, library_versions
from pipeline.models.loading import default_device, load_target_and_drafts
from pipeline.planning.grid import GridSpec, ModelGroup, Shard
from pipeline.planning.plugins import load_drafting_methods
from pipeline.storage.schema import make_row
from pipeline.storage.store import rows_to_table


def quiet_libraries() -> None:
    """No progress bars from transformers (weights, GGUF tensors) or the hub in a worker: its
    output is the run's log, one line per shard."""
    from transformers.utils import logging as transformers_logging

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    transformers_logging.disable_progress_bar()


def held_gpus(device: torch.device) -> int:
    """The GPUs this process holds: all it sees (Ray shows an actor only those it was given, and
    the target of a pair given `gpus: N` is spread over them)."""
    return torch.cuda.device_count() if device.type == "cuda" else 1


class TargetWorker:
    """Loads one model group — a target and every draft the grid pairs with it — once per
    process (and the captioner, if any method set needs it), after importing the grid's own
    drafting methods (`drafting_methods`: import paths); `allow_text`: the grid marked the
    group's pairs `text_only`. `threads`: CPU threads torch computes with (None: torch's default);
    `timed_repeats`: runs of each live decode of a timed sample, the fastest kept."""

    def __init__(
        self, group: ModelGroup, captioner: str | None = None, drafting_methods: tuple[str, ...] = (),
        allow_text: bool = False, threads: int | None = None, timed_repeats: int = GridSpec.timed_repeats,
    ) -> None:
        if threads:
            torch.set_num_threads(threads)
        load_drafting_methods(list(drafting_methods))
        quiet_libraries()
        self.group = group
        self.device = default_device()
        self.target, self.drafts = load_target_and_drafts(
            resolve_model(group.target), {d: resolve_model(d) for d in group.drafts}, dtype=group.dtype,
            device=self.device, allow_text=allow_text, gpus=held_gpus(self.device),
        )
        self.captioner = load_captioner(captioner, self.device) if captioner else None
        self.records = ShardRecords(self.target, self.drafts, self.captioner, timed_repeats)

    def device_name(self) -> str:
        """Where it decodes: the device, and on a CPU the threads (e.g. `cpu (threads: 2)`)."""
        return str(self.device) if self.device.type != "cpu" else f"cpu (threads: {torch.get_num_threads()})"

    def environment(self) -> dict[str, str | int]:
        """What every row of this worker was timed on: the device by name (`NVIDIA H200 x2` for a
        target spread over two), torch, transformers and the machine's cores (what its load
        average is read against)."""
        name = device_name(self.device) + (f" x{self.target.gpus}" if self.target.gpus > 1 else "")
        return {"device_name": name, **library_versions(), "cpu_cores": cpu_cores()}

    def run_shard(self, shard: Shard, samples: dict[str, Sample]) -> pa.Table:
        """Rows for every item of the shard, in item order; one bad sample is one error row."""
        if shard.group != self.group:
            raise ValueError(f"shard {shard.shard_id} is for {shard.group.label}, "
                             f"this worker holds {self.group.label}")
        records, environment = self.records.of(shard, samples), self.environment()
        return rows_to_table([
            make_row(shard.run, shard.shard_id, config, samples[sample_id], records[(config, sample_id)],
                     sample_id in shard.timed, environment)
            for config, sample_id in shard.items
        ])


def remote_worker(
    group: ModelGroup, captioner: str | None, *, num_gpus: float, num_cpus: float, max_restarts: int = 2,
    drafting_methods: tuple[str, ...] = (), allow_text: bool = False, threads: int | None = None,
    timed_repeats: int = GridSpec.timed_repeats,
):
    """Start a `TargetWorker` actor. Ray restarts it up to `max_restarts` times and retries
    calls that were in flight when it died; the runner (`actors.runner`) re-dispatches beyond that."""
    import ray

    actor = ray.remote(TargetWorker).options(
        num_gpus=num_gpus, num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=max_restarts
    )
    return actor.remote(group, captioner, drafting_methods, allow_text, threads, timed_repeats)
