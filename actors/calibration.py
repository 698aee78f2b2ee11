"""Calibration runs: each model pair's step costs measured on the hardware a grid runs on, a
target once for all its drafts, in a Ray task holding a GPU (or a node's CPUs) or on this
machine; which pairs a grid run measures after it ran, and the reports rewritten with them.
`jobs/calibrate.py` and `jobs/full_grid.py` run it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.decoding.calibration import Calibration
from pipeline.decoding.step_costs import calibrate_drafts
from pipeline.models.loading import default_device, load_target_and_drafts
from pipeline.planning.grid import GridSpec
from pipeline.storage.calibration_store import read_calibrations, write_calibration

if TYPE_CHECKING:
    from ray.util.queue import Queue

PROGRESS_POLL_S = 5  # how often the driver prints the calibration tasks' progress lines
# alternating rounds, timed steps per measurement: a grid's own unless it sets them
ROUNDS, REPEATS = GridSpec.calibrate_rounds, GridSpec.calibrate_repeats
CONTEXTS = (64, 256, 1024, 2048)  # prompt lengths: how a draft's step cost grows with the context


@dataclass(frozen=True)
class Shapes:
    """What a grid's speedup table needs timed: its gammas (a chain verifies gamma + 1
    tokens), every other target forward of its blocks (a tree's nodes + 1) and its draft
    batches (rows per draft step)."""

    gammas: tuple[int, ...]
    verify_tokens: tuple[int, ...] = ()
    draft_rows: tuple[int, ...] = ()
    rows_by_draft: tuple[tuple[str, tuple[int, ...]], ...] = ()  # each draft's own batches, where known
    contexts: tuple[int, ...] = CONTEXTS  # prompt lengths at which one draft and target step are timed
    batches: tuple[int, ...] = ()  # batch sizes over 1 at which the same steps are timed again

    def covered_by(self, calibration: Calibration) -> bool:
        """Whether a stored calibration timed all of these."""
        tokens = {g + 1 for g in self.gammas} | set(self.verify_tokens)
        return (tokens <= set(calibration.verify_tokens)
                and set(self.rows_of(calibration.draft)) <= set(calibration.draft_row_counts)
                and (bool(calibration.context_tokens) or not self.contexts)
                and set(self.batches) <= set(calibration.batch_sizes))


    def rows_of(self, draft: str) -> tuple[int, ...]:
        """The draft batches `draft` steps in the grid (all of the grid's where not known)."""
        return dict(self.rows_by_draft).get(draft, self.draft_rows)


def grid_shapes(spec: GridSpec) -> Shapes:
    configs = [config for config in spec.configs() if not config.decode.is_ar]
    shapes = [(c.pair.draft, shape) for c in configs
              for shape in c.decode.verify.block_shapes(c.decode.gamma, len(c.decode.methods))]
    by_draft: dict[str, set[int]] = {}
    for draft, (_, _, rows) in shapes:
        by_draft.setdefault(draft, set()).add(rows)
    return Shapes(spec.gamma, tuple(sorted({nodes + 1 for _, (_, nodes, _) in shapes})),
                  tuple(sorted({rows for _, (_, _, rows) in shapes})),
                  tuple((draft, tuple(sorted(rows))) for draft, rows in by_draft.items()),
                  batches=tuple(sorted(set(spec.batch) - {1})))


def measure(target: str, drafts: tuple[str, ...], dtype: str, shapes: Shapes, repeats: int, rounds: int,
            threads: int | None = None, lines: Queue | None = None, gpus: int = 1) -> list[Calibration]:
    """A target's calibration with each of its drafts (the target measured once per round for
    all), a line as each model's steps of a round are timed, printed or, from a Ray task, put on
    `lines` for the driver to print; `threads`: CPU threads to time with (those the grid's timed
    decodes use); `gpus`: spread the target over that many (a grid pair's `gpus:`)."""
    import torch

    from actors.model_files import resolve_model
    from actors.target_worker import quiet_libraries

    quiet_libraries()
    if threads:
        torch.set_num_threads(threads)
    # allow_text: a pair named here passed the grid's checks, or was named by hand (multimodal
    # families outside pipeline.models.families are refused all the same)
    loaded, models = load_target_and_drafts(resolve_model(target), {d: resolve_model(d) for d in drafts},
                                            dtype=dtype, device=default_device(), allow_text=True, gpus=gpus)

    def progress(line: str) -> None:
        line = f"calibration {target} ({dtype}), {line}"
        if lines is None:
            print(line, flush=True)
        else:
            lines.put(line)

    results = calibrate_drafts(loaded, [models[d] for d in drafts], gammas=shapes.gammas,
                               verify_tokens=shapes.verify_tokens,
                               rows_per_draft=[shapes.rows_of(d) for d in drafts],
                               repeats=repeats, rounds=rounds, progress=progress,
                               contexts=shapes.contexts, batches=shapes.batches, draft_names=drafts)
    for result, draft in zip(results, drafts):
        # the grid's names, as in the results rows
        result.target, result.draft, result.dtype = target, draft, dtype
    return results


def groups_of(pairs: list[tuple[str, str, str]]) -> dict[tuple[str, str], tuple[str, ...]]:
    """(target, dtype) -> its drafts, in the pairs' order."""
    groups: dict[tuple[str, str], list[str]] = {}
    for target, draft, dtype in pairs:
        groups.setdefault((target, dtype), []).append(draft)
    return {key: tuple(dict.fromkeys(drafts)) for key, drafts in groups.items()}


def calibrate_pairs(
    pairs: list[tuple[str, str, str]], out: str, *, shapes: Shapes, repeats: int = REPEATS,
    rounds: int = ROUNDS, ray_tasks: bool, spread: tuple[tuple[str, str, int], ...] = (),
) -> list[Calibration]:
    """Measure each (target, draft, dtype), each target once for all its drafts, and write them
    under OUT; with `ray_tasks`, each target in a Ray task holding one GPU when the cluster
    has GPUs (the GPUs `spread` gives a target, as `GridSpec.spread`), else a node's CPUs, so
    measurements on a CPU never overlap (Ray must be initialised)."""
    groups = groups_of(pairs)
    verified = ", ".join(map(str, sorted({g + 1 for g in shapes.gammas} | set(shapes.verify_tokens))))
    print(f"calibrating {len(pairs)} pair(s) of {len(groups)} target(s), {rounds} rounds of {repeats} timed "
          f"steps per measurement (verify {verified} tokens)", flush=True)
    if ray_tasks:
        results = _measured_on_ray(groups, shapes, repeats, rounds, spread)
    else:
        results = [c for (t, dt), drafts in groups.items()
                   for c in measure(t, drafts, dt, shapes, repeats, rounds)]
    for result in results:
        path = write_calibration(out, result)
        spread = result.ratio_draft_target_rounds
        ratios = ", ".join(f"{n}: {r:.3f}" for n, r in zip(result.verify_tokens, result.verify_ratios))
        print(
            f"calibration {result.target} / {result.draft} ({result.dtype}) on {result.device}: "
            f"Tq/Tp={result.ratio_draft_target:.3f} [{min(spread):.3f}-{max(spread):.3f} "
            f"over {result.rounds} rounds] Tp(n)/Tp={ratios} "
            f"(Tp={result.target_token_s * 1e3:.1f} ms, Tq={result.draft_token_s * 1e3:.1f} ms) -> {path}"
        )
    return results


def _measured_on_ray(groups: dict[tuple[str, str], tuple[str, ...]], shapes: Shapes, repeats: int,
                     rounds: int, spread: tuple[tuple[str, str, int], ...]) -> list[Calibration]:
    """Each target with its drafts in a Ray task; the tasks' progress lines come back through a
    queue and are printed here as they arrive (a grid's driver relays no worker output)."""
    import ray
    from ray.util.queue import Empty, Queue

    from actors.ray_info import node_cpus

    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    # Without GPUs each task takes a whole node's CPUs as threads, as the grid's timed
    # decodes do (actors.runner), so two measurements never time each other's load.
    cpus = 1 if gpus else node_cpus()
    task = ray.remote(num_gpus=gpus, num_cpus=cpus)(measure)
    threads = None if gpus else max(1, int(cpus))
    lines = Queue(actor_options={"num_cpus": 0})  # takes no CPU from the measurement
    given = {(target, dtype): n for target, dtype, n in spread} if gpus else {}
    held = {key: given.get(key, gpus) for key in groups}
    refs = {task.options(num_gpus=held[(t, dt)]).remote(t, drafts, dt, shapes, repeats, rounds, threads,
                                                        lines, max(1, held[(t, dt)])): t
            for (t, dt), drafts in groups.items()}
    waiting, results = list(refs), {}
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=1, timeout=PROGRESS_POLL_S)
        while True:
            try:
                print(lines.get_nowait(), flush=True)
            except Empty:
                break
        for ref in ready:
            results[ref] = ray.get(ref)
            print(f"calibration {len(results)}/{len(refs)} targets done ({refs[ref]})", flush=True)
    return [c for ref in refs for c in results[ref]]


def rewrite_reports(out: str, pairs: list[tuple[str, str, str]]) -> list[Path]:
    """Write again the report of every run under OUT holding rows of a pair just calibrated:
    its speedup tables draw on the calibration."""
    from pipeline.reports.report_inputs import read_inputs
    from pipeline.reports.summary import write_summary
    from pipeline.storage.store import report_dir, run_names

    written = []
    for run in run_names(out):
        inputs = read_inputs(out, run)  # one partition folder at a time
        cells = inputs.cells
        if any(((cells["target"] == t) & (cells["draft"] == d) & (cells["dtype"] == dt)).any()
               for t, d, dt in pairs):
            write_summary(out, run, inputs)
            written.append(report_dir(out, run))
            print(f"report rewritten with the new calibration: {written[-1] / 'summary.md'}", flush=True)
    return written


def pairs_to_measure(
    pairs: list[tuple[str, str, str]], out: str, *, shapes: Shapes, rows_written: int, recalibrate: bool
) -> list[tuple[str, str, str]]:
    """The pairs a grid run measures after it ran: all of them when it wrote rows or was asked
    to (`--recalibrate`), else only those whose stored calibration lacks one of the grid's
    block shapes; so a rerun that adds nothing reports exactly what it reported before."""
    stored = read_calibrations(out)
    todo = []
    for target, draft, dtype in pairs:
        found = stored.latest(target, draft, dtype)
        if found is None or not shapes.covered_by(found) or rows_written or recalibrate:
            todo.append((target, draft, dtype))
        else:
            print(f"calibration {target} / {draft} ({dtype}): reusing the one measured "
                  f"{found.measured_at or 'earlier'} (no new rows; --recalibrate measures again)")
    return todo
