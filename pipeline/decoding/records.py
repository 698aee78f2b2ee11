"""What one decoded sample produces: a plain row, the same for live runs and trace replay."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

# Why a sample failed: its input (prompt, image), the model or decoding itself, or a resource
# (device memory). Only resource failures can go away by themselves: a rerun retries them.
# A fixed input changes the prompt hash, so its rows are recomputed as new rows anyway.
ERROR_CATEGORIES = ("input", "model", "resource")
RETRYABLE_ERRORS = frozenset({"resource"})


@dataclass
class SampleRecord:
    """Outcome of decoding one sample under one configuration.

    `accepted_per_block[b]` counts the draft proposals the target accepted in block b (only
    those kept before EOS / max_new_tokens); `weights_per_block[b]` is the ensemble weight w*
    used for block b (one float per drafting method). Timings are seconds, measured after
    device synchronisation (CUDA events on a GPU, read once per sample).
    """

    sample_id: str
    mode: str = "live"  # live | replay | ar (plain autoregressive baseline)
    engine: str | None = None  # static | eager: the engine that decoded (replay: that collected the traces)
    # how the decode steps ran: captured | compiled | uncompiled, or several joined by "+" (replay: None)
    steps: str | None = None
    # why this decode left the requested path (a failed compile, engine), if it did
    fallback: str | None = None
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    accepted_per_block: list[int] = field(default_factory=list)
    weights_per_block: list[list[float]] = field(default_factory=list)
    # a bandit tree's: the shape (index) each block used
    shape_per_block: list[int] = field(default_factory=list)
    time_prefill_s: float = 0.0
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_total_s: float = 0.0
    time_tabed_s: float = 0.0  # choosing weights, mixing and scoring history (inside draft/verify)
    time_tabed_draft_s: float = 0.0  # the part of it inside draft (choosing and mixing weights)
    time_vision_s: float = 0.0  # image features and captions, inside the prefills
    time_target_prefill_s: float = 0.0
    time_draft_prefill_s: float = 0.0
    time_wall_s: float = 0.0  # the whole decode on the host's clock: the phases plus host overhead
    # this request's latency: from the start of its decode (its batch's) to the block that
    # finished it, on the host's clock (decoded alone: time_wall_s)
    time_request_s: float | None = None
    # this request's time to its first token: from the start of its decode to the transfer that
    # brought its first new token to the host (AR: the prefill's; SD: its first block's)
    time_first_token_s: float | None = None
    # the target's prompt as tokenized (an image counts as its placeholder tokens): acceptance by
    # prompt length (pipeline.reports.acceptance_where); replay rows carry their trace's
    prompt_tokens: int | None = None
    # new tokens of every request decoded with this one (itself alone: its own) over time_total_s
    batch_tokens_per_s: float | None = None
    # joules the GPU used for this request: its decode's energy (NVML) split over the requests
    # decoded together by their new tokens, so sums over rows are the energy spent; None where
    # no counter could be read (a CPU, no pynvml), never 0
    energy_j: float | None = None
    # a live greedy row's accepted counts as trace replay scores the same sample (None elsewhere):
    # the replay-fidelity check of pipeline.reports.fidelity
    replay_accepted_per_block: list[int] | None = None
    # the machine's 1-minute load average before and after a live decode (None for replay):
    # above its cores, something competed with the walltime (pipeline.reports.noise)
    load_before: float | None = None
    load_after: float | None = None
    # requests decoded together with this one (`pipeline.decoding.loop`); every one of them
    # carries the batch's timings (None: decoded alone)
    batch_requests: int | None = None
    error: str | None = None
    error_category: str | None = None  # one of ERROR_CATEGORIES when `error` is set

    @property
    def blocks(self) -> int:
        return len(self.accepted_per_block)

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tau(self) -> float:
        """Block efficiency: 1 + mean accepted proposals per block (docs/algorithm.md §1); NaN if
        no block."""
        if not self.accepted_per_block:
            return float("nan")
        return 1.0 + sum(self.accepted_per_block) / len(self.accepted_per_block)

    def stamp_first_token(self, output: list[int], started: float) -> None:
        """Time to first token, once the output holds one (the host has just read it, so the
        device has caught up); `started`: the decode's start on the same clock."""
        if self.time_first_token_s is None and output:
            self.time_first_token_s = time.perf_counter() - started

    def to_row(self) -> dict:
        """Flat dict for a Parquet row (derived fields included)."""
        row = asdict(self)
        row.update(blocks=self.blocks, new_tokens=self.new_tokens, tau=self.tau)
        return row
