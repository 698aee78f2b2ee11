"""What a run's report reads, made one partition folder (target, draft, dataset) at a time: a
paper-scale run holds tens of millions of rows, and no section needs them side by side.

Each folder's rows are read (`report_rows`), reduced, and let go before the next is read:
- `cells`: the rows summed per configuration, dataset and turn (`cells`), which the tau tables,
  the category averages, the findings, the paper check and completeness read;
- `requests`: a few numbers per row that decoded (`requests`), which the acceptance tables and
  the tau figure read;
- `live`: every column of the rows that were timed, decoded live or as AR, batched, or failed,
  which the speedup, latency, batch, noise, fidelity and failure sections read;
- the lossless audit's counts and differing rows (a row's AR reference is in its own folder);
- the first-turn samples' image notes, and the candidates of the weights figure.

A cell, a request's counts and an audited sample never span two folders, and every part keeps
its rows' order, so the parts of the folders put one after another give each table what it got
from all rows read at once (the same values in the same order).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from pipeline.reports.audit import IdsReader, audit_counts
from pipeline.reports.cells import cell_ids, cells_of, concat_frames
from pipeline.reports.weights_figure import weight_candidates
from pipeline.reports.report import batch_of, decoded_alone
from pipeline.reports.report_rows import read_report_rows, release_memory, with_columns
from pipeline.reports.requests import Requests, concat_requests, requests_of
from pipeline.storage.store import shard_files


@dataclass
class ReportInputs:
    """What every section of one run's report reads (module docstring)."""

    rows: int  # the run's rows, failed ones included
    failed: int
    cells: pd.DataFrame
    requests: Requests
    live: pd.DataFrame
    audit: tuple[pd.DataFrame, pd.DataFrame]  # `audit.audit_counts`
    first_turns: pd.DataFrame  # turn, sample_id and image notes of each first-turn sample decoded alone
    weight_rows: pd.DataFrame  # `weights_figure.weight_candidates` of the rows decoded alone

    def alone(self) -> tuple[pd.DataFrame, Requests, pd.DataFrame]:
        """(cells, requests, live rows) of batch 1, which every table but the batch sweep's and the
        audit reads (`report.decoded_alone`)."""
        if (batch_of(self.cells) == 1).all():  # no batched rows: nothing to copy
            return self.cells, self.requests, self.live
        cells = decoded_alone(self.cells)
        return cells, self.requests.within(cells), decoded_alone(self.live)


def live_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows whose every column a section reads: timed, decoded live or as AR, batched, failed."""
    keep = rows["mode"].isin(["live", "ar"]) | rows["error"].notna() | (batch_of(rows) > 1)
    if "timed" in rows:
        keep |= rows["timed"].fillna(False).astype(bool)
    return rows[keep]


def inputs_of(rows: pd.DataFrame, read_ids: IdsReader | None = None, first_cell: int = 0) -> ReportInputs:
    """The `ReportInputs` of `rows` (one partition folder's, or a whole run's read at once), their
    cells numbered from `first_cell`. `read_ids` reads the output ids of rows the audit finds
    different, where `rows` hold digests alone."""
    ids = cell_ids(rows)
    cells = cells_of(rows, ids)
    cells.index += first_cell
    ids = ids + first_cell
    alone = decoded_alone(rows)
    first = alone.loc[alone["turn"] == "first", [c for c in ("turn", "sample_id", "image_conversions")
                                                 if c in alone]]
    return ReportInputs(rows=len(rows), failed=int(rows["error"].notna().sum()), cells=cells,
                        requests=requests_of(rows, ids, cells), live=live_rows(rows),
                        audit=audit_counts(rows, read_ids), first_turns=first.drop_duplicates("sample_id"),
                        weight_rows=weight_candidates(alone))


def combined(parts: list[ReportInputs]) -> ReportInputs:
    """Several folders' inputs as the run's, in the order given (their cells numbered apart)."""
    frames = lambda name: concat_frames([getattr(part, name) for part in parts])
    cells = frames("cells")  # numbered 0, 1, ... across the folders: `first_cell`
    return ReportInputs(rows=sum(part.rows for part in parts), failed=sum(part.failed for part in parts),
                        cells=cells, requests=concat_requests([part.requests for part in parts], cells),
                        live=frames("live"),
                        audit=tuple(concat_frames([part.audit[i] for part in parts]) for i in (0, 1)),
                        first_turns=frames("first_turns").drop_duplicates("sample_id"),
                        weight_rows=frames("weight_rows"))


def read_inputs(out: str | Path, run: str, on_unreadable: Callable[[Path], None] | None = None
                ) -> ReportInputs:
    """The run's `ReportInputs`, its partition folders read one at a time, in the order a read
    of the whole run meets them."""
    folders = list(dict.fromkeys(path.parent for path in shard_files(out, run)))
    read_ids = lambda chosen: with_columns(out, run, chosen, ["output_ids"])
    parts: list[ReportInputs] = []
    for folder in folders:
        rows = read_report_rows(out, run, on_unreadable=on_unreadable, folder=folder)  # no other file opened
        parts.append(inputs_of(rows, read_ids, first_cell=sum(len(part.cells) for part in parts)))
        del rows
        release_memory()
    if not parts:
        return inputs_of(read_report_rows(out, run), read_ids)
    run_inputs = combined(parts)
    del parts
    release_memory()  # the folders' parts, now copied into the run's
    return run_inputs
