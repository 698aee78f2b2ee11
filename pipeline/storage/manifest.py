"""A run's manifest: every grid ever written into the run and the rows each asks for.

Researchers extend yesterday's sweep with a few configurations under the same run name; that
stays allowed, but never silently. Before Ray starts the job says what a new grid adds and which
stored configurations it leaves alone (`extension_text`), the manifest keeps each grid
(`record_grid`), and completeness is judged against the union of their rows (`expected_rows`).
Lives in `OUT/_runs/<run>.json` (underscore: pandas and pyarrow skip it).
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from pipeline.planning.grid import GridSpec, RunConfig, WorkUnit
from pipeline.storage.atomic import set_aside, write_atomically

GROUP = ("target", "draft", "dtype", "turn")  # completeness is reported per pair, dtype and turn
SHOWN = 4  # configurations named in the extension line; the rest are counted


@dataclass(frozen=True)
class Unit:
    """Rows a grid asks for of one configuration, dataset and turn."""

    config_key: str
    label: str
    target: str
    draft: str
    dtype: str
    turn: str
    dataset: str
    rows: int


@dataclass(frozen=True)
class GridRecord:
    """One grid written into a run: its name, a digest of what it asks for, when it was first
    run, and its units (empty for manifests from before units were kept: then `counts`)."""

    name: str
    digest: str
    written_at: str
    units: tuple[Unit, ...] = ()
    # (target, draft, dtype, turn, rows), old manifests
    counts: tuple[tuple[str, str, str, str, int], ...] = ()

    @property
    def rows(self) -> int:
        return sum(u.rows for u in self.units) or sum(c[-1] for c in self.counts)

    @property
    def config_keys(self) -> set[str]:
        return {u.config_key for u in self.units}


def config_label(config: RunConfig) -> str:
    """A configuration in words: pair, methods (with a tree's kind), policy, gamma."""
    tree = "" if config.decode.is_ar or config.decode.verify.is_chain else f" ({config.decode.verify.label})"
    knobs = "" if config.decode.is_ar else f" {config.decode.policy.label}, gamma {config.decode.gamma}"
    return f"{config.pair.label} {config.decode.method_label}{tree}{knobs}"


def grid_record(spec: GridSpec, samples_of: Callable[[WorkUnit], int]) -> GridRecord:
    """What `spec` asks for; `samples_of(unit)`: how many samples the unit decodes."""
    units = tuple(
        Unit(unit.config.key(), config_label(unit.config), unit.config.pair.target, unit.config.pair.draft,
             unit.config.pair.dtype, unit.turn, unit.dataset, samples_of(unit))
        for unit in spec.units()
    )
    identity = sorted((u.config_key, u.dataset, u.turn, u.rows) for u in units)
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:12]
    return GridRecord(spec.name, digest, time.strftime("%Y-%m-%d %H:%M:%S"), units)


def manifest_path(out: str | Path, run: str) -> Path:
    return Path(out) / "_runs" / f"{quote(run, safe='')}.json"


def read_manifest(out: str | Path, run: str) -> dict | None:
    path = manifest_path(out, run)
    return json.loads(path.read_text()) if path.is_file() else None


def write_manifest(out: str | Path, run: str, manifest: dict) -> None:
    """Replace the manifest whole, as shards are written (`pipeline.storage.atomic`)."""
    path = manifest_path(out, run)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, lambda sink: sink.write(json.dumps(manifest, indent=1).encode()))


def run_grids(out: str | Path, run: str) -> list[GridRecord]:
    """The grids written into a run, oldest first; a manifest from before grids were kept
    (one `grid` and its per-pair `expected` counts) reads as one record without units. A
    manifest that cannot be read (empty, cut short, not the shape written) is set aside and
    read as none: the run's rows stay, its report counts the grids recorded from then on."""
    try:
        manifest = read_manifest(out, run)
        if manifest is None:
            return []
        if "grids" not in manifest:
            counts = tuple((e["target"], e["draft"], e["dtype"], e["turn"], int(e["rows"]))
                           for e in manifest.get("expected", []))
            return [GridRecord(str(manifest.get("grid", run)), "", "", counts=counts)]
        return [GridRecord(g["name"], g["digest"], g["written_at"], tuple(Unit(**u) for u in g["units"]),
                           tuple(tuple(c) for c in g.get("counts", []))) for g in manifest["grids"]]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        set_aside(manifest_path(out, run), err,
                  "the grids recorded before it are forgotten; completeness counts the grids run from now on")
        return []


def record_grid(out: str | Path, run: str, record: GridRecord) -> list[GridRecord]:
    """Add `record` to the run's manifest, unless the same grid is already there; returns the grids."""
    grids = run_grids(out, run)
    if all(g.digest != record.digest for g in grids):
        grids.append(record)
    write_manifest(out, run, {"grids": [asdict(g) for g in grids]})
    return grids


def expected_rows(grids: list[GridRecord]) -> list[dict] | None:
    """Rows the union of `grids` asks for, per pair, dtype and turn: a unit several grids share
    counts once (with the most samples any asked for); a grid from an old manifest counts its
    own totals, which its group's count is never below. None when no grid is recorded."""
    if not grids:
        return None
    units: dict[tuple, Unit] = {}
    for grid in grids:
        for unit in grid.units:
            key = (unit.config_key, unit.dataset, unit.turn)
            if key not in units or units[key].rows < unit.rows:
                units[key] = unit
    totals: dict[tuple, int] = defaultdict(int)
    for unit in units.values():
        totals[(unit.target, unit.draft, unit.dtype, unit.turn)] += unit.rows
    for grid in grids:
        for *group, rows in grid.counts:
            totals[tuple(group)] = max(totals[tuple(group)], rows)
    return [dict(zip(GROUP, group), rows=rows) for group, rows in totals.items()]


def extension_text(run: str, stored: list[GridRecord], stored_keys: set[str], new: GridRecord) -> str | None:
    """One line, when `new` is not a grid the run already holds: what it adds and which stored
    configurations (`stored_keys`: those of the run's rows, whatever their grid) it leaves
    alone. None for a new run or a rerun of a stored grid."""
    known = stored_keys | {k for g in stored for k in g.config_keys}
    if not known or any(g.digest == new.digest for g in stored):
        return None
    labels = ({u.config_key: u.label for g in stored for u in g.units}
              | {u.config_key: u.label for u in new.units})
    added = sorted({u.label for u in new.units if u.config_key not in known})
    kept = sorted(labels.get(k, k) for k in known - new.config_keys)
    held = ", ".join(f"{g.name} ({g.rows} rows)" for g in stored) or "rows from before manifests"
    named = lambda found: "" if not found else (" (" + "; ".join(found[:SHOWN])
                                                + ("; ..." if len(found) > SHOWN else "") + ")")
    return (f"run {run!r} already holds grid(s) {held}; grid {new.name!r} adds {len(added)} configuration(s)"
            f"{named(added)} and leaves {len(kept)} stored configuration(s) alone{named(kept)}; "
            "completeness is judged against all of them")
