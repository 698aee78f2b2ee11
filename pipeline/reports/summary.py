"""Write a run's reports next to its results: Markdown and CSV tables, PNG plots.

`OUT/_report-<run>/` (underscore: pandas and pyarrow skip it; written whole or not at all):
`summary.md` (completeness, tau per dataset, category averages, expected and measured speedup with
the samples timed, each target's drafts side by side and the calibration used, M vs T and where MT*
lands, the lossless audit, replay fidelity, image conversions, failed samples), one CSV per table,
the paper's Table 1/2 as LaTeX (`table1.tex`, `table2.tex`), and `tau` and `weights` figures as
PNG, PDF and SVG.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd

from pipeline.reports.acceptance import CONFIG, acceptance_table, per_position_table, request_taus
from pipeline.reports.acceptance_plots import per_position_figure, request_tau_figure
from pipeline.reports.acceptance_where import acceptance_where_section
from pipeline.reports.audit import GROUP_KEYS, audit_table, lossless_text
from pipeline.reports.batch_plots import batch_figure
from pipeline.reports.batch_sweep import batch_table, batch_text
from pipeline.reports.calibration_section import calibration_section
from pipeline.reports.completeness import completeness_table, completeness_text, grids_text
from pipeline.reports.failures import failed_section, failures_report
from pipeline.reports.fidelity import GROUP_KEYS as FIDELITY_KEYS, fidelity_table, fidelity_text
from pipeline.reports.headline import headline
from pipeline.reports.latency import latency_table
from pipeline.reports.latex import paper_tables
from pipeline.reports.marks import HIGHER_EVERYWHERE
from pipeline.reports.noise import noise_section, shown
from pipeline.reports.paper_check import paper_check
from pipeline.reports.plots import save
from pipeline.reports.weights_figure import weight_ratio_figure, weight_ratio_rows
from pipeline.reports.report_inputs import ReportInputs, inputs_of
from pipeline.reports.report_rows import ON_DEMAND, with_columns
from pipeline.reports.report import (
    category_table, findings_text, markdown_table, method_findings, tau_table, without_html,
)
from pipeline.reports.speedup import SPEEDUP_MARKS, SPEEDUP_TITLE, draft_size_table, speedup_table
from pipeline.reports.requests import Requests
from pipeline.reports.tau_heatmap import tau_figure
from pipeline.storage.calibration_store import Calibrations, read_calibrations
from pipeline.storage.manifest import expected_rows, run_grids
from pipeline.storage.run_lock import lock_holder
from pipeline.storage.store import report_dir


def write_summary(out: str | Path, run: str, rows: pd.DataFrame | ReportInputs) -> str:
    """Write every table and plot of one run, from its rows or from what the report reads of them
    (`report_inputs.read_inputs`, one partition folder at a time); return the Markdown that was
    written. The report is built in a temporary folder and swapped in whole: a full disk or a
    crash midway leaves the previous report as it was, never new tables beside an old summary."""
    if isinstance(rows, pd.DataFrame):
        rows = inputs_of(rows, lambda chosen: with_columns(out, run, chosen, ["output_ids"]))
    final = report_dir(out, run)
    folder, old = (final.with_name(f".{final.name}.{os.getpid()}.{end}") for end in ("tmp", "old"))
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        text = _write_report(out, run, rows, folder)
        if final.exists():
            os.replace(final, old)
        os.replace(folder, final)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return text


def _write_report(out: str | Path, run: str, inputs: ReportInputs, folder: Path) -> str:
    if inputs.failed == inputs.rows:
        completeness = completeness_section(out, run, inputs.cells, folder)
        text = failures_report(run, inputs.rows, inputs.live, completeness)
        (folder / "summary.md").write_text(text)
        return text
    calibrations = read_calibrations(out)
    cells, requests, live = inputs.alone()  # batched rows: the batch sweep and the audit read them
    tables = {
        "tau": (HIGHER_EVERYWHERE,
                "Block efficiency tau per dataset (tau = accepted proposals + 1 per block, the paper's "
                "convention; tau0 = tau - 1 below; pooled over blocks; Avg. = benchmark datasets)",
                tau_table(cells)),
        "categories": (HIGHER_EVERYWHERE, "Category averages (paper Table 2)", category_table(cells)),
        "speedup": (
            SPEEDUP_MARKS,
            SPEEDUP_TITLE,
            speedup_table(live, calibrations, cells),
        ),
    }
    speedup = tables["speedup"][2]
    audited = audit_table(*inputs.audit)
    sections = [f"# Run {run}: {inputs.rows} rows, {inputs.failed} failed",
                headline(speedup, audited[0]), completeness_section(out, run, inputs.cells, folder)]
    for name, (marks, title, table) in tables.items():
        table.to_csv(folder / f"{name}.csv")
        sections.append(f"## {title}\n\n{markdown_table(shown(table), marks)}")
    sections += [timed_samples_text(live), draft_size_section(speedup, calibrations, folder),
                 calibration_section(calibrations, folder),
                 measurement_noise_section(live, calibrations, speedup)]
    findings = method_findings(cells)
    findings.to_csv(folder / "findings.csv")
    sections.append(
        "## M vs T, and where TABED lands (pooled tau; rank among the SD configurations run, 1 = best)\n\n"
        f"{findings_text(findings)}\n\n{markdown_table(findings)}"
    )
    sections += [batch_section(inputs.live, calibrations, folder), acceptance_section(requests, folder),
                 acceptance_where_section(requests, folder), latency_section(live, folder),
                 paper_section(cells, folder), audit_section(audited, folder),
                 fidelity_section(inputs.live, folder), image_conversions_text(inputs.first_turns)]
    sections.append(failed_section(inputs.live))
    for name, latex in paper_tables(cells, tables["tau"][2], tables["categories"][2]).items():
        (folder / name).write_text(latex)
    weights = with_columns(out, run, weight_ratio_rows(inputs.weight_rows), ON_DEMAND)
    sections.append(figures_section(requests, weights, folder))
    text = without_html("\n\n".join(section for section in sections if section) + "\n")
    (folder / "summary.md").write_text(text)
    return text


def completeness_section(out: str | Path, run: str, cells: pd.DataFrame, folder: Path) -> str:
    """Expected (the union of the grids in the run's manifest), present, failed and missing rows
    (`cells`: the run's, `pipeline.reports.cells`)."""
    grids = run_grids(out, run)
    expected = expected_rows(grids)
    table = completeness_table(cells, expected)
    table.to_csv(folder / "completeness.csv")
    text = completeness_text(table, expected, lock_holder(out, run))
    return (f"## Completeness\n\n{text}{grids_text(grids)}\n\n"
            f"{markdown_table(table)}")


def checked_section(folder: Path, name: str, title: str, text: str, table: pd.DataFrame,
                    keys: list[str]) -> str:
    """A check's table as `name`.csv and as a section: title, the sentence saying what it found, the table."""
    table.to_csv(folder / f"{name}.csv", index=False)
    return f"## {title}\n\n{text}\n\n{markdown_table(table.set_index(keys))}"


def audit_section(audited: tuple[pd.DataFrame, pd.DataFrame], folder: Path) -> str:
    """Greedy speculative rows equal to the target's own greedy output, per pair, dtype, engine
    (`audited`: `audit`'s table and divergences)."""
    table, differ = audited
    differ.to_csv(folder / "divergences.csv", index=False)
    return checked_section(folder, "lossless",
                           "Lossless audit: greedy speculative output vs the target's own greedy output",
                           lossless_text(table, differ), table, GROUP_KEYS)


def batch_section(rows: pd.DataFrame, calibrations: Calibrations, folder: Path) -> str:
    """Speedup over AR at the same batch against the batch size (`pipeline.reports.batch_sweep`);
    empty unless the run decoded batches over 1."""
    table = batch_table(rows, calibrations)
    if table.empty:
        return ""
    table.to_csv(folder / "batch.csv")
    lines = ["## Batch sweep: where speculative decoding stops paying (first turns, live rows; "
             "speedup = AR walltime / SD walltime decoding the same requests in batches of the same size; "
             "`expected` = Eq. 1 corrected, with draft and verify costs calibrated at that batch size; "
             "`latency s` = median per-request latency; "
             "`= AR here` / `= batch 1`: outputs equal to AR at this batch / to the sample decoded alone)",
             batch_text(table), markdown_table(shown(table))]
    made = batch_figure(table)
    if made is not None:
        save(made[0], folder / "batch")
        lines.append(f"![batch](batch.png)\n\n> {made[1]}")
    return "\n\n".join(lines)


def latency_section(rows: pd.DataFrame, folder: Path) -> str:
    """TTFT, TPOT and request latency percentiles per configuration (`pipeline.reports.latency`)."""
    table = latency_table(rows)
    if table.empty:
        return ""
    table.to_csv(folder / "latency.csv")
    return ("## Latency per request (P50/P95/P99 over the requests decoded live; timed ones where the "
            "run timed some)\n\n`ttft`: time to first token (the prefill and, for SD, the first block); "
            "`tpot`: time per output token after the first, (latency - ttft) / (new tokens - 1), so SD's "
            "bursts count once per token they deliver; `latency`: the whole request. With few requests "
            "the upper percentiles approach the slowest request.\n\n"
            + markdown_table(table.round({c: 3 if c.endswith("_s") else 2 for c in table})))


def acceptance_section(requests: Requests, folder: Path) -> str:
    """Both tau conventions, the acceptance rate, tau per request and acceptance by draft
    position (`pipeline.reports.acceptance`): what other tools and papers report."""
    table, positions = acceptance_table(requests), per_position_table(requests)
    if table.empty:
        return ""
    table.to_csv(folder / "acceptance.csv", index=False)
    positions.to_csv(folder / "per_position.csv", index=False)
    shown_columns = ["requests", "tau", "tau0", "acceptance_rate", "tau_request_median", "tau_request_q1",
                     "tau_request_q3"]
    lines = ["## Acceptance in other tools' conventions (per configuration, every dataset pooled)\n\n"
             "`tau` = accepted proposals + 1 per block (block efficiency, the TABED paper's); "
             "`tau0` = tau - 1, accepted drafts per block (EAGLE's and ViSpec's acceptance length); "
             "`acceptance_rate` = accepted drafts / drafted positions; `tau_request_*` = median and "
             "quartiles of each request's own tau (pooling weighs long answers more). Acceptance by draft "
             "position: `per_position.csv`.",
             markdown_table(table.set_index(CONFIG)[shown_columns])]
    for stem, draw, data in (("per_position", per_position_figure, positions),
                             ("tau_per_request", request_tau_figure, request_taus(requests))):
        made = draw(data)
        if made is not None:
            save(made[0], folder / stem)
            lines.append(f"![{stem}]({stem}.png)\n\n> {made[1]}")
    return "\n\n".join(lines)


def paper_section(cells: pd.DataFrame, folder: Path) -> str:
    """Our tau beside the TABED paper's published cells, for pairs it published (`paper_check`)."""
    both, missing = paper_check(cells)
    both.to_csv(folder / "paper_check.csv", index=False)
    lines = ["## Beside the paper (TABED's Tables 1 and 10-14, block efficiency tau)"]
    if missing:
        lines.append("No published reference for " + "; ".join(f"{d} -> {t}" for t, d in missing)
                     + ": the paper reports mjbooo/lvlm68m, lvlm68m-ov and lvlm160m-bf16 drafts with "
                     "LLaVA-1.5 7B and LLaVA-NeXT 7B/13B targets.")
    if len(both):
        index = ["table", "target", "draft", "dtype", "policy", "window", "distance", "turn", "method"]
        averages = both[both["dataset"] == "Avg."].set_index(index)
        lines += ["Benchmark averages (every cell in `paper_check.csv`; `difference` = ours - paper):",
                  markdown_table(averages[["paper", "ours", "difference"]])]
    return "\n\n".join(lines)


def image_conversions_text(rows: pd.DataFrame) -> str:
    """How many of the run's images were converted beyond the pixel format (scaled from 16
    bits, alpha composited on white, EXIF-rotated), counted once per first-turn sample (`rows`:
    the first turns, `ReportInputs.first_turns`, or every row)."""
    first = rows[rows["turn"] == "first"].drop_duplicates("sample_id")
    notes = [note.split(": ", 1)[-1]
             for conversions in first["image_conversions"].dropna() for note in conversions]
    if not notes:
        return (f"## Images\n\nNo image of the {len(first)} first-turn samples needed more than a "
                "format conversion.")
    counts = pd.Series(notes).value_counts()
    listed = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    return (f"## Images\n\n{len(notes)} image conversions in {len(first)} first-turn samples: {listed} "
            "(pipeline/data/images.py).")


def fidelity_section(rows: pd.DataFrame, folder: Path) -> str:
    """Live greedy rows against the replay of the same configuration and sample."""
    table = fidelity_table(rows)
    return checked_section(folder, "fidelity",
                           "Replay fidelity: live greedy rows vs trace replay "
                           "of the same configuration and sample",
                           fidelity_text(table), table, FIDELITY_KEYS)


def timed_samples_text(rows: pd.DataFrame) -> str:
    """Which samples the measured walltimes come from, per pair (grid `live_samples`)."""
    if "timed" not in rows.columns:
        return ""
    timed = rows[rows["timed"].fillna(False).astype(bool) & (rows["turn"] == "first")]
    if timed.empty:
        return ""
    lines = [
        f"- {target} <- {draft} ({dtype}): " + ", ".join(sorted(group["sample_id"].unique()))
        for (target, draft, dtype), group in timed.groupby(["target", "draft", "dtype"])
    ]
    return ("Measured walltimes come from these first-turn samples (seeded by `live_seed`, spread over "
            "datasets and distinct images):\n\n" + "\n".join(lines))


def draft_size_section(speedup: pd.DataFrame, calibrations: Calibrations, folder: Path) -> str:
    """A target's drafts compared (only where the grid pairs one target with several drafts)."""
    table = draft_size_table(speedup, calibrations)
    if table.empty:
        return ""
    table.to_csv(folder / "draft_sizes.csv")
    return ("## Draft sizes: each target's drafts side by side (first turns; Tq/Tp from the calibration "
            "used; tau, Eq. 1 and measured speedup per method)\n\n"
            + markdown_table(shown(table)))


def measurement_noise_section(rows: pd.DataFrame, calibrations: Calibrations, speedup: pd.DataFrame) -> str:
    """Which measured figures are noise (pipeline.reports.noise), or how quiet the measuring was."""
    timed = (rows[rows["timed"].fillna(False).astype(bool) & rows["mode"].isin(["live", "ar"])]
             if "timed" in rows else rows[:0])
    return noise_section(calibrations, timed, speedup)


def figures_section(requests: Requests, weight_rows: pd.DataFrame, folder: Path) -> str:
    """Each figure as PNG, PDF and SVG, shown with its caption: tau per cell (from `requests`)
    and the weights of the rows the weights figure draws (`weight_rows`, with their
    `report_rows.ON_DEMAND` columns)."""
    lines = ["## Figures (PNG, PDF and SVG at a two-column paper's width; `-one-column` files at one "
             "column's; LaTeX tables: table1.tex, table2.tex)"]
    for stem, draw, drawn in (("tau", tau_figure, requests), ("weights", weight_ratio_figure, weight_rows)):
        made = draw(drawn)
        if made is not None:
            figure, caption = made
            save(figure, folder / stem)
            save(draw(drawn, width="one-column")[0], folder / f"{stem}-one-column")
            lines.append(f"![{stem}]({stem}.png)\n\n> {caption}")
    return "\n\n".join(lines)
