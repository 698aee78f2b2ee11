"""The speedup tables: expected speedup (paper Eq. 1 and its corrected form) beside the measured
walltime speedup, and each target's drafts side by side.

Walltimes are only ever compared within one pair, dtype, engine and machine: a row of
the speedup table is one configuration timed on one machine (`timed_on`), and its measured
speedup divides AR and SD walltimes of that same machine.
"""
from __future__ import annotations

import pandas as pd

from pipeline.planning.verify_entries import verify_of_row
from pipeline.reports.noise import noise_parts, noise_text, ratio_spreads, rows_load
from pipeline.reports.cells import cells_of
from pipeline.reports.marks import Marks
from pipeline.reports.pooling import pooled_tau, row_sums
from pipeline.reports.report import gamma_shown, method_order, wall_times, with_dashes, with_tree_labels
from pipeline.reports.time_split import time_split_text
from pipeline.storage.calibration_store import Calibrations

# Walltimes of different engines, devices, step modes or library versions are never pooled or
# compared: `timed_on` names what a row's walltime was measured on, and comes before the method
# so that best values are marked within one pair, engine and machine (every configuration run
# there, whatever its gamma or tree depth, is a candidate).
SPEEDUP_INDEX = ["target", "draft", "dtype", "engine", "timed_on", "method_label", "policy", "gamma"]
# Grid axes that make two timings incomparable (AR rows carry them too: each configuration is
# timed against AR at the same values), and knobs of a configuration; each becomes an index
# level where the run's rows differ in it, so no row pools two of its values.
EXPERIMENT_AXES = ["temperature", "seed", "max_new_tokens"]
CONFIG_AXES = ["window", "distance"]
# what a win is in each column (pipeline.reports.marks)
SPEEDUP_MARKS = Marks(higher=("tau", "tau timed"),
                      speedups=("eq1", "corrected", "measured", "paired", "global"),
                      lower=("J/token", "J/accepted"))
SPEEDUP_TITLE = (  # the speedup table's title in the summary
    "Speedup: expected from tau and measured latency ratios (Eq. 1 and its CPU-corrected form, "
    "at each row's gamma), measured = AR walltime / SD walltime on the samples run live, per "
    "engine and machine (`timed_on`: device, how decode steps ran, torch, transformers; "
    "`-`: not timed); `paired` and `global` are MMSpec's speedup_paired (the mean over samples "
    "of SD tokens/s over AR tokens/s) and speedup_global (summed tokens over summed wall time, "
    "SD over AR) on the same samples. `tau` here pools every first-turn block of every dataset, "
    "OOD included, so it differs from the tau table's `Avg.` (the mean of the benchmark datasets' "
    "cells); `tau timed` pools only the samples the walltime was measured on; `noise` says why a "
    "figure is printed as unreliable; where a GPU's energy counter was read (NVML), `J/token` and "
    "`J/accepted` give joules per new token and per accepted draft token of the timed rows")
TIMING_COLUMNS = ["device_name", "steps", "torch_version", "transformers_version"]
UNTIMED = "-"  # a configuration without live rows: tau and Eq. 1 only


def timing_label(rows: pd.DataFrame) -> pd.Series:
    """Per row, what its walltime was measured on: device, how decode steps ran, torch and
    transformers (`unrecorded` for rows written before these columns existed)."""
    columns = [rows[c] if c in rows else pd.Series(None, index=rows.index, dtype=object)
               for c in TIMING_COLUMNS]

    def label(device, steps, torch_version, transformers_version) -> str:
        if all(pd.isna(v) for v in (device, steps, torch_version, transformers_version)):
            return "unrecorded"
        name = lambda v: "?" if pd.isna(v) else v
        return (f"{name(device)}, {name(steps)} steps, torch {name(torch_version)}, "
                f"transformers {name(transformers_version)}")

    labels: dict[tuple, str] = {}  # one per machine, not one per row
    return pd.Series([labels[values] if values in labels else labels.setdefault(values, label(*values))
                      for values in zip(*columns)], index=rows.index, dtype=object)


def speedup_table(df: pd.DataFrame, calibrations: Calibrations, cells: pd.DataFrame | None = None
                  ) -> pd.DataFrame:
    """Expected speedup from pooled first-turn tau and measured latency ratios, beside the
    measured walltime speedup of live runs (AR time / SD time over the samples both ran on
    the same engine and machine), one row per configuration, gamma and machine it was timed on.

    `tau` pools every first-turn block of every dataset, OOD ones included (the tau table's
    `Avg.` is instead the mean of the benchmark datasets' cells); `tau timed` pools the live
    rows the walltime was measured on, a few samples whose tau can differ from the rest.
    `noise` names the figures that are unreliable and why (`pipeline.reports.noise`): a
    latency ratio whose rounds spread too far, or a timing taken above the machine's cores.

    `eq1` is the paper's tau / (gamma Tq/Tp + 1) at the row's own gamma, which assumes one
    draft row and a verify that costs one target step. `corrected` is Eq. 1 generalised to the
    block's real shape: gamma steps of the measured draft batch (m rows for an m-method chain,
    a row per method and branch for a candidate tree, per method and node of a dynamic tree's
    level) plus the measured cost of one target forward over the block's tokens (gamma + 1 for
    a chain, nodes + 1 for a tree), both from the calibration; NaN where it did not time them.
    `paired` and `global` are MMSpec's two speedups on the same rows (`throughput_speedups`).

    `df` holds the rows timed (live and AR) at least; `cells` sums every row (`cells.cells_of`,
    made from `df` when not given).
    """
    cells = cells_of(df) if cells is None else cells
    ok = _first_turns(cells)  # what pools tau and counts blocks: every first-turn row, summed per cell
    timings = _first_turns(df[df["mode"].isin(["live", "ar"])])  # what was timed: live and AR rows
    timings["timed_on"] = timing_label(timings)
    sd = ok[ok["method_label"] != "AR"]  # a configuration knob of AR (window, distance) is null
    varying = ([c for c in EXPERIMENT_AXES if c in ok and ok[c].nunique(dropna=False) > 1]
               + [c for c in CONFIG_AXES if c in ok and sd[c].nunique(dropna=False) > 1])
    ok, timings = with_dashes(ok, varying), with_dashes(timings, varying)
    experiment = [c for c in varying if c in EXPERIMENT_AXES]
    index = (SPEEDUP_INDEX[:4] + experiment + SPEEDUP_INDEX[4:] + [c for c in varying if c in CONFIG_AXES])
    config_keys = [k for k in index if k != "timed_on"]
    timed_sd = timings[timings["mode"] == "live"]
    timed_of = dict(iter(timings.groupby(config_keys, sort=False))) if len(timings) else {}
    rows = []
    for key, group in ok.groupby(config_keys, sort=False):
        config = dict(zip(config_keys, key))
        row = config | {"tau": pooled_tau(group)}
        calib = calibrations.latest(config["target"], config["draft"], config["dtype"])
        steps, label = group["draft_steps"].iloc[0], config["method_label"]
        flags: dict[str, list] = {}
        shapes = None if label == "AR" or pd.isna(steps) else block_shapes(group, int(steps))
        if shapes is not None and calib is not None:
            used = shapes_used(group, shapes)  # (steps, nodes, rows), blocks
            blocks = sum(n for _, n in used)
            steps = sum(shape[0] * n for shape, n in used) / blocks
            row["eq1"] = row["tau"] / (steps * calib.ratio_draft_target + 1)
            row["corrected"] = row["tau"] / calib.block_cost(used)
            flags = {}
            for (_, nodes, draft_rows), _ in used:
                for column, spreads in ratio_spreads(calib, draft_rows, nodes + 1).items():
                    flags[column] = list(dict.fromkeys(
                        flags.get(column, []) + [s for s in spreads if s.noisy]))
        same_pair = lambda rows: rows[(rows[SPEEDUP_INDEX[:4] + experiment]
                                       == [config[k] for k in SPEEDUP_INDEX[:4] + experiment]).all(axis=1)]
        baseline = same_pair(timings[timings["mode"] == "ar"])
        group = timed_of.get(key, timings[:0])  # the configuration's own timed rows
        timed = same_pair(timed_sd) if label == "AR" else group[group["mode"] == "live"]
        for machine in sorted(set(timed["timed_on"])) or [UNTIMED]:
            mine, ar = group[group["timed_on"] == machine], baseline[baseline["timed_on"] == machine]
            live = mine[mine["mode"] == "live"]
            load = rows_load(pd.concat([live, ar[ar["sample_id"].isin(live["sample_id"])]]))
            measured_flags = [load] if label != "AR" and load is not None and load.noisy else []
            split = time_split_text(ar if label == "AR" else live)
            rows.append(row | {"timed_on": machine,
                               "tau timed": pooled_tau(live) if len(live) else float("nan"),
                               "measured": _measured_speedup(mine, ar, label),
                               **throughput_speedups(live if label != "AR" else ar, ar),
                               "time split %": split,
                               **energy_per_token(ar if label == "AR" else live),
                               "noise": noise_text(flags | {"measured": measured_flags})})
    table = pd.DataFrame(rows).reindex(columns=index + ["tau", "tau timed", "eq1", "corrected",
                                                        "measured", "paired", "global", *ENERGY,
                                                        "time split %", "noise"])
    if table[list(ENERGY)].isna().all().all():  # no row's energy measured (a CPU, no NVML)
        table = table.drop(columns=list(ENERGY))
    table = table.set_index(index)

    def order(i: int) -> tuple:
        at = dict(zip(index, table.index[i]))
        return (*(at[k] for k in SPEEDUP_INDEX[:4]), *(str(at[k]) for k in experiment),
                at["method_label"] != "AR", at["timed_on"] == UNTIMED, at["timed_on"],
                method_order(at["method_label"]), at["policy"], isinstance(at["gamma"], str),
                str(at["gamma"]).zfill(4), *(str(at[k]) for k in varying))

    return table.iloc[sorted(range(len(table)), key=order)]


def _first_turns(rows: pd.DataFrame) -> pd.DataFrame:
    """First-turn rows (or cells) that decoded, trees named, `gamma` as tables print it and
    `draft_steps` numeric for a block's shape."""
    ok = with_tree_labels(rows[rows["error"].isna() & (rows["turn"] == "first")].copy())
    # rows from before engines were recorded
    ok["engine"] = ok["engine"].astype(object).where(ok["engine"].notna(), "-")
    ok["draft_steps"] = ok["gamma"]
    ok["gamma"] = gamma_shown(ok)
    return ok


def draft_size_table(speedup: pd.DataFrame, calibrations: Calibrations) -> pd.DataFrame:
    """The drafts of each target side by side (draft size as a grid axis, like the paper's 68M
    vs 160M), from the speedup table: Tq/Tp, then per method label (M and each TABED label
    run) first-turn tau, Eq. 1 and measured speedup; cheapest draft first. One block per
    target, dtype, engine, gamma and machine timed on; a draft that was not timed (`-`) shows
    its tau and Eq. 1 in every block of its target. Empty when no target has two drafts."""
    if speedup.empty:
        return pd.DataFrame()
    table = speedup.reset_index()
    table = table[table["method_label"] != "AR"]
    groups = ["target", "dtype", "engine", "gamma"]
    table = table[table.groupby(groups)["draft"].transform("nunique") > 1]
    if table.empty:
        return pd.DataFrame()
    labels = [label for label in sorted(table["method_label"].unique(), key=method_order)
              if label.partition(" (")[0] == "M" or label.partition(" (")[0].endswith("*")]
    rows = []
    for key, block in table.groupby(groups, sort=False):
        machines = sorted(set(block["timed_on"]) - {UNTIMED}) or [UNTIMED]
        for machine in machines:
            seen = block[block["timed_on"].isin({machine, UNTIMED})].sort_values(
                "timed_on", key=lambda s: s == UNTIMED)
            for draft, group in seen.groupby("draft", sort=False):
                calib = calibrations.latest(key[0], draft, key[1])
                row = dict(zip(groups, key)) | {
                    "timed_on": machine, "draft": draft,
                    "Tq/Tp": float("nan") if calib is None else calib.ratio_draft_target,
                }
                by_label = group.drop_duplicates("method_label").set_index("method_label")
                noise = {"Tq/Tp": [] if calib is None
                         else [s for s in ratio_spreads(calib, 1, 2)["eq1"] if s.noisy]}
                for label in labels:
                    why = noise_parts(by_label["noise"].get(label, ""))
                    for column in ("tau", "eq1", "measured"):
                        row[f"{column} {label}"] = by_label[column].get(label, float("nan"))
                        noise[f"{column} {label}"] = [why[column]] if column in why else []
                rows.append(row | {"noise": noise_text(noise)})
    result = pd.DataFrame(rows).set_index(groups + ["timed_on", "draft"])
    return result.iloc[sorted(range(len(result)),
                              key=lambda i: (tuple(map(str, result.index[i][:5])), result["Tq/Tp"].iloc[i]))]


def block_shapes(rows: pd.DataFrame, gamma: int) -> list[tuple[int, int, int]] | None:
    """(draft steps, nodes, draft rows) of each block shape one configuration's rows may use, as
    they record it; rows from before that column: from their verify columns (None where those
    name a kind of one's own, which a report does not import)."""
    first = {key: (None if _missing(value) else value) for key, value in rows.iloc[0].items()}
    if first.get("verify_block_shapes") is not None:
        return [tuple(int(v) for v in shape) for shape in first["verify_block_shapes"]]
    methods = first.get("methods") or first["method_label"].partition(" (")[0].rstrip("*")
    try:
        return verify_of_row(first).block_shapes(gamma, len(methods))
    except ValueError:
        return None


def shapes_used(rows: pd.DataFrame,
                shapes: list[tuple[int, int, int]]) -> list[tuple[tuple[int, int, int], int]]:
    """Each block shape with how many blocks used it: a bandit's rows say per block
    (`shape_per_block`, or a cell's `shape_counts`); any other kind has one shape, every block."""
    if len(shapes) == 1 or not {"shape_per_block", "shape_counts"} & set(rows.columns):
        return [(shapes[0], max(1, int(rows["blocks"].sum())))]
    counts = [0] * len(shapes)
    if "shape_counts" in rows:
        for cell in rows["shape_counts"].dropna():
            for arm, n in enumerate(cell):
                counts[arm] += n
    else:
        for arms in rows["shape_per_block"]:
            for arm in arms if hasattr(arms, "__len__") else []:  # None or pd.NA where none was recorded
                counts[int(arm)] += 1
    return [(shape, n) for shape, n in zip(shapes, counts) if n] or [(shapes[0], 1)]


ENERGY = ("J/token", "J/accepted")


def energy_per_token(rows: pd.DataFrame) -> dict[str, float]:
    """Joules per new token and per accepted draft token of timed rows whose energy was
    measured (NVML; every row of them, else NaN: never a partial or zero figure)."""
    if rows.empty or "energy_j" not in rows or rows["energy_j"].isna().any():
        return dict.fromkeys(ENERGY, float("nan"))
    energy = rows["energy_j"]
    accepted = int(row_sums(rows["accepted_per_block"]).sum())
    return {"J/token": energy.sum() / rows["new_tokens"].sum(),
            "J/accepted": energy.sum() / accepted if accepted else float("nan")}


def _missing(value) -> bool:
    return not hasattr(value, "__len__") and pd.isna(value)


def _measured_speedup(group: pd.DataFrame, baseline: pd.DataFrame, label: str) -> float:
    """AR walltime / SD walltime of one configuration's live rows, over the samples both ran;
    `baseline` holds the AR rows of the same pair, engine and machine."""
    ar = baseline.groupby("sample_id")["time_total_s"].mean()
    if label == "AR":
        return 1.0 if not ar.empty else float("nan")
    sd = group[group["mode"] == "live"].groupby("sample_id")["time_total_s"].mean()
    both = ar.index.intersection(sd.index)
    if both.empty or sd[both].sum() <= 0:
        return float("nan")
    return float(ar[both].sum() / sd[both].sum())


def throughput_speedups(live: pd.DataFrame, ar: pd.DataFrame) -> dict[str, float]:
    """MMSpec's speedups (its `summarize_metrics`: speedup_paired, speedup_global) over the
    samples both ran, from tokens per second of each decode's wall clock: `paired` is the mean
    over samples of SD's over AR's, `global` SD's summed tokens over summed wall time over AR's,
    which is `measured` wherever SD and AR answer with the same number of tokens."""
    nan = {"paired": float("nan"), "global": float("nan")}
    if live.empty or ar.empty:
        return nan
    per_sample = lambda rows: (rows.assign(wall=wall_times(rows))
                               .groupby("sample_id")[["new_tokens", "wall"]].mean())
    sd, base = per_sample(live), per_sample(ar)
    both = sd.index.intersection(base.index)
    sd, base = sd.loc[both], base.loc[both]
    if both.empty or (sd["wall"] <= 0).any() or (base["wall"] <= 0).any() or (base["new_tokens"] <= 0).any():
        return nan
    rate = lambda rows: rows["new_tokens"] / rows["wall"]
    return {"paired": float((rate(sd) / rate(base)).mean()),
            "global": float((sd["new_tokens"].sum() / sd["wall"].sum())
                            / (base["new_tokens"].sum() / base["wall"].sum()))}
