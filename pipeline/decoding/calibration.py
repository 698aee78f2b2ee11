"""A pair's latency calibration as one type, torch-free: what `pipeline.decoding.step_costs`
measures and writes, and what reports read back. Files written before a field existed are read
by `Calibration.from_row`, the one place that knows their layouts; everything else reads a
complete `Calibration`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from statistics import median
from typing import Any, Mapping

MAX_ROWS = 4  # the largest ensemble (MTCP) drafts four rows per step
INT_FIELDS = {"gamma", "repeats", "rounds", "cpu_cores", "verify_tokens", "draft_row_counts",
              "context_tokens", "batch_sizes"}


def expected_speedup(tau: float, gamma: int, ratio_draft_target: float, ratio_verify: float = 1.0) -> float:
    """Paper Eq. 1 when `ratio_verify` is 1; the CPU-corrected form otherwise. At batch B both
    ratios are B's (a draft step of B x m rows and a verify of B rows over a target step of B
    rows), tau each request's: the batch-aware form."""
    return tau / (gamma * ratio_draft_target + ratio_verify)


@dataclass
class Calibration:
    """One pair's step costs in one dtype, on one device and engine: Tp (a target step), the
    verify curve Tp(n), Tq with each draft batch size, and every round of every ratio."""

    target: str
    draft: str
    device: str
    dtype: str
    gamma: int  # the largest gamma measured: target_verify_s and ratio_verify_rounds are its verify's
    target_token_s: float  # Tp: one cached decode step of the target
    target_verify_s: float  # Tp(gamma+1): one target forward over gamma+1 tokens
    draft_token_s: float  # Tq: one cached decode step of the draft, one row
    draft_rows_token_s: list[float]  # Tq with each of `draft_row_counts` rows in the batch (ensembles, trees)
    repeats: int  # timed steps per measurement, after warm-up; the median is kept
    engine: str = "eager"  # the decoding engine whose steps were timed (files from before engines: eager)
    rounds: int = 1  # times every measurement was repeated, target and draft alternating
    ratio_draft_target_rounds: list[float] = field(default_factory=list)  # Tq/Tp of each round
    ratio_verify_rounds: list[float] = field(default_factory=list)  # Tp(gamma+1)/Tp of each round
    # Tq(m rows)/Tp, median over rounds, per draft_row_counts
    draft_rows_ratio: list[float] = field(default_factory=list)
    measured_at: str = ""  # UTC, ISO 8601
    device_name: str = ""  # e.g. NVIDIA H100 80GB HBM3 (pipeline.models.devices)
    # the verify-latency curve: token counts n fed in one target forward, the median seconds and
    # the median over rounds of Tp(n)/Tp(1) for each
    verify_tokens: list[int] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    verify_ratios: list[float] = field(default_factory=list)
    # rows timed (files from before it: 1..MAX_ROWS)
    draft_row_counts: list[int] = field(default_factory=list)
    # every round's ratio, not only the median: per verify_tokens entry Tp(n)/Tp, per
    # draft_row_counts entry Tq(m rows)/Tp (pipeline.reports.noise judges their spread)
    verify_ratio_rounds: list[list[float]] = field(default_factory=list)
    draft_rows_ratio_rounds: list[list[float]] = field(default_factory=list)
    # the machine's 1-minute load average before and after measuring, and its cores
    load_before: float | None = None
    load_after: float | None = None
    cpu_cores: int | None = None
    # one cached step of the target and of the draft (one row) after prompts of `context_tokens`
    # tokens, medians over rounds: how each step's cost grows with the context
    context_tokens: list[int] = field(default_factory=list)
    context_target_s: list[float] = field(default_factory=list)
    context_draft_s: list[float] = field(default_factory=list)
    # several requests in one batch (`pipeline.decoding.loop`), per batch size over 1,
    # medians over rounds: Tp with that many target rows, Tp(n)/Tp at that batch per
    # verify_tokens entry, and Tq(batch x rows)/Tp at that batch per draft_row_counts entry
    batch_sizes: list[int] = field(default_factory=list)
    batch_target_token_s: list[float] = field(default_factory=list)
    batch_verify_ratios: list[list[float]] = field(default_factory=list)
    batch_draft_ratios: list[list[float]] = field(default_factory=list)

    @property
    def ratio_draft_target(self) -> float:
        """Tq/Tp: the median round's, or one measurement's."""
        rounds = self.ratio_draft_target_rounds
        return median(rounds) if rounds else self.draft_token_s / self.target_token_s

    @property
    def ratio_verify(self) -> float:
        """Tp(gamma + 1)/Tp at the calibration's own gamma."""
        rounds = self.ratio_verify_rounds
        return median(rounds) if rounds else self.target_verify_s / self.target_token_s

    @property
    def where(self) -> str:
        """Where it was measured: the device's name (e.g. the GPU model), else `cpu`/`cuda:0`."""
        return self.device_name or self.device

    def verify_ratio(self, tokens: int, batch: int = 1) -> float:
        """Tp(tokens)/Tp(1) from the verify curve, with `batch` target rows; NaN when not measured."""
        if tokens not in self.verify_tokens:
            return math.nan
        ratios = self._at_batch(batch, self.verify_ratios, self.batch_verify_ratios)
        return ratios[self.verify_tokens.index(tokens)]

    def verify_rounds(self, tokens: int) -> list[float]:
        """Tp(tokens)/Tp of every round ([] when not measured or not kept)."""
        rounds = self.verify_ratio_rounds
        if tokens not in self.verify_tokens or not rounds:
            return []
        return list(rounds[self.verify_tokens.index(tokens)])

    def block_cost(self, used: list[tuple[tuple[int, int, int], int]], batch: int = 1) -> float:
        """A block's cost in target steps, averaged over the blocks of each (draft steps, nodes,
        draft rows) shape `used` (with its count of blocks): gamma Tq(rows)/Tp + Tp(nodes + 1)/Tp,
        Eq. 1's corrected denominator (`expected_speedup`), at `batch` requests."""
        blocks = sum(n for _, n in used)
        return sum(n * (steps * self.draft_ratio(rows, batch) + self.verify_ratio(nodes + 1, batch))
                   for (steps, nodes, rows), n in used) / blocks

    def draft_ratio(self, rows: int, batch: int = 1) -> float:
        """Tq with `rows` rows in the draft batch over Tp (an m-method ensemble drafts m rows, a
        candidate tree one group of them per branch), each `batch` times over for `batch`
        requests (over Tp with `batch` rows); NaN when not timed."""
        counts = self.draft_row_counts
        if rows not in counts:
            return math.nan
        return self._at_batch(batch, self.draft_rows_ratio, self.batch_draft_ratios)[counts.index(rows)]

    def target_step_s(self, batch: int = 1) -> float:
        """Tp with `batch` target rows (one token each); NaN when not measured."""
        if batch == 1:
            return self.target_token_s
        if batch not in self.batch_sizes:
            return math.nan
        return self.batch_target_token_s[self.batch_sizes.index(batch)]

    def _at_batch(self, batch: int, alone: list[float], batched: list[list[float]]) -> list[float]:
        if batch == 1:
            return alone
        if batch not in self.batch_sizes:
            return [math.nan] * len(alone)
        return batched[self.batch_sizes.index(batch)]

    def draft_rounds(self, rows: int) -> list[float]:
        """Tq(rows)/Tp of every round ([] when not timed or not kept)."""
        counts, rounds = self.draft_row_counts, self.draft_rows_ratio_rounds
        return list(rounds[counts.index(rows)]) if rows in counts and rounds else []

    def to_row(self) -> dict[str, Any]:
        """The file's one row: every field, and the two headline ratios for anyone reading it raw."""
        return asdict(self) | {"ratio_draft_target": self.ratio_draft_target,
                               "ratio_verify": self.ratio_verify}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Calibration:
        """A stored row as a complete Calibration. Files from before a field existed lack it or
        hold a null: the field's default; before the verify curve, the one verify measured is
        the curve's one point (gamma + 1); before batch sizes were listed, 1..n rows were timed;
        before per-batch ratios, each batch's time over Tp is its ratio."""
        known = {f.name for f in fields(cls)}
        values = {name: _plain(value) for name, value in row.items() if name in known and not _missing(value)}
        for name in INT_FIELDS & set(values):  # a column that held a null somewhere is read as floats
            value = values[name]
            values[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        calibration = cls(**values)
        if not calibration.verify_tokens:
            calibration.verify_tokens = [calibration.gamma + 1]
            calibration.verify_ratios = [calibration.ratio_verify]
            rounds = calibration.ratio_verify_rounds
            calibration.verify_ratio_rounds = [list(rounds)] if rounds else []
        if not calibration.draft_rows_ratio:
            tp = calibration.target_token_s
            calibration.draft_rows_ratio = [t / tp for t in calibration.draft_rows_token_s]
        if not calibration.draft_row_counts:
            calibration.draft_row_counts = list(range(1, len(calibration.draft_rows_ratio) + 1))
        return calibration


def _missing(value: Any) -> bool:
    """A null cell: None, or a float NaN (pandas' null for a missing list or number)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (nested ones too) as Python numbers and lists."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value
