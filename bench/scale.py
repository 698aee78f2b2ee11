"""How the report, a resume's planning and the notebook scale with a run's size.

    python bench/scale.py --rows 1000000 [--template results] [--work /tmp/scale]

Builds a run of about N rows from a real one (`--template`, default the default job's
`results`): the template's rows copied under new sample ids, keys and shard ids, so every list
length, partition and rows-per-file is a real run's, with the template's calibration and a
manifest whose expected rows are the template's times the copies (a complete run). Then each
step runs in a fresh process and reports its wall time and peak memory (RSS): `summarize`
(`jobs/summarize.py`), `resume_plan` (the rows a resume reads to decide what is left),
`notebook` (the analysis notebook's first table) and, where `jobs/compact.py` exists,
`compact` followed by `summarize` again on the compacted run. One `name=value` line per
figure, also written to `--log-dir` (default bench/results/).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from functools import reduce
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pipeline.storage.compaction import MERGED_PREFIX, TARGET_BYTES  # noqa: E402
from pipeline.storage.manifest import manifest_path, read_manifest  # noqa: E402
from pipeline.storage.schema import FILE_SCHEMA, PARTITIONS  # noqa: E402
from pipeline.storage.store import file_table, read_table, run_names, shard_path, write_shards  # noqa: E402

# {code}: the checkout whose jobs are measured (`--code`: an older commit's worktree measures before)
NOTEBOOK = ("import json, os, sys; os.chdir({code!r}); os.environ['TABED_RESULTS'] = {out!r}; "
            "cells = [c for c in json.load(open('notebooks/analysis.ipynb'))['cells'] "
            "if c['cell_type'] == 'code']; "
            "[exec(''.join(l for l in c['source'] if not l.startswith('%')), globals()) for c in cells[:2]]; "
            "print(len(df), 'rows of the chosen target')")
STEPS = {
    "summarize": ["{code}/jobs/summarize.py", "{out}", "--run", "{run}"],
    "resume_plan": ["-c", "import sys; sys.path.insert(0, {code!r}); from pipeline.storage.store import "
                          "written_rows; rows = written_rows({out!r}, {run!r}, {turns!r}); "
                          "print(sum(1 for _ in rows), 'rows read')"],
    "notebook": ["-c", NOTEBOOK],  # its first two code cells: its first table, then one target's rows
    "compact": ["{code}/jobs/compact.py", "{out}", "--run", "{run}"],
}


def copied(template: pa.Table, copy: int) -> pa.Table:
    """The template's rows as copy `copy`: new sample ids, keys and shard ids, all else kept."""
    suffix = f"~{copy}"
    changed = {name: pc.binary_join_element_wise(template[name], pa.scalar(suffix), "")
               for name in ("sample_id", "key", "shard")}
    return template.drop_columns(list(changed)).append_column("sample_id", changed["sample_id"]) \
        .append_column("key", changed["key"]).append_column("shard", changed["shard"])


def make_run(template_out: Path, run: str, out: Path, rows: int, compacted: bool = False) -> None:
    """Write about `rows` rows into `out` (a fresh folder) from the template run: a file per shard
    and partition as a run writes them, or (`compacted`) each partition's copies straight into
    merged files as a compaction leaves them (ten million rows as small files took 13 minutes to
    write here, and 10 more to compact)."""
    template = read_table(template_out, run)
    copies = max(1, round(rows / template.num_rows))
    if compacted:
        write_compacted(out, template, copies)
    else:
        groups = [template.filter(pc.equal(template["shard"], shard)) for shard in
                  pc.unique(template["shard"]).to_pylist()]
        for copy in range(copies):
            for group in groups:
                write_shards(out, copied(group, copy))
    manifest = read_manifest(template_out, run) or {"grids": []}
    for grid in manifest["grids"]:
        for unit in grid.get("units", []):
            unit["rows"] *= copies
    manifest_path(out, run).parent.mkdir(parents=True, exist_ok=True)
    manifest_path(out, run).write_text(json.dumps(manifest))
    if (template_out / "_calibration").is_dir():
        shutil.copytree(template_out / "_calibration", out / "_calibration")


def write_compacted(out: Path, template: pa.Table, copies: int) -> None:
    """Each partition's rows, copied `copies` times, into merged files as `jobs/compact.py`
    writes them: row groups of about `TARGET_BYTES` in memory, a new file once one reaches
    `TARGET_BYTES` on disk."""
    for values in {tuple(row.values()) for row in template.select(list(PARTITIONS)).to_pylist()}:
        mask = reduce(pc.and_, [pc.equal(template[name], value) for name, value in zip(PARTITIONS, values)])
        part, folder = template.filter(mask), shard_path(out, *values, "x").parent
        folder.mkdir(parents=True, exist_ok=True)
        copy = 0
        while copy < copies:
            with open(folder / f"{MERGED_PREFIX}{copy:016x}.parquet", "wb") as sink, \
                    pq.ParquetWriter(sink, FILE_SCHEMA) as writer:
                while copy < copies and sink.tell() < TARGET_BYTES:
                    buffered, size = [], 0
                    while copy < copies and size < TARGET_BYTES:
                        buffered.append(file_table(copied(part, copy)))
                        size, copy = size + buffered[-1].nbytes, copy + 1
                    writer.write_table(pa.concat_tables(buffered))


def measured(argv: list[str]) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB, last output line) of one step in a fresh Python process."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, cwd=ROOT)
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)  # this child's own peak, not every child's so far
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{argv[0]} failed ({os.waitstatus_to_exitcode(status)}):\n{output[-3000:]}")
    lines = [line for line in output.splitlines() if line.strip()]
    return seconds, usage.ru_maxrss / 1024, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, required=True, help="rows of the synthetic run (about)")
    parser.add_argument("--template", default=str(ROOT / "results"),
                        help="a finished results directory to copy rows from (default: %(default)s)")
    parser.add_argument("--run", help="the template's run (default: its only or first run)")
    parser.add_argument("--work", default="/tmp/tabed-scale", help="where the synthetic run is written")
    parser.add_argument("--steps", default=",".join(STEPS), help="which steps to time, comma-separated")
    parser.add_argument("--log-dir", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--label", default="", help="a word for the log file's name, e.g. before or after")
    parser.add_argument("--code", default=str(ROOT),
                        help="the checkout whose jobs are measured, e.g. a worktree of an older commit "
                             "(default: this one)")
    parser.add_argument("--compacted", action="store_true",
                        help="write the run as a finished run leaves it once compacted: a few large files "
                             "per partition (the way to make ten million rows in minutes)")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the run already under --work (made by an earlier call) as it is")
    args = parser.parse_args(argv)
    template = Path(args.template)
    runs = run_names(template)
    if not runs:
        raise SystemExit(f"no run under {template}: run `python jobs/full_grid.py` first, or pass --template")
    run = args.run or runs[0]
    out = Path(args.work) / f"rows-{args.rows}"
    code = Path(args.code).resolve()
    revision = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    changed = subprocess.run(["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True).stdout.strip()
    revision += "+uncommitted changes" if revision and changed else ""
    lines = [f"host={platform.node()} cpus={os.cpu_count()} python={platform.python_version()}",
             f"template={template} run={run} code={code} commit={revision or '?'}"]
    start = time.perf_counter()
    if not (args.reuse and out.is_dir()):
        shutil.rmtree(out, ignore_errors=True)
        make_run(template, run, out, args.rows, args.compacted)
        lines.append(f"make_s={time.perf_counter() - start:.1f}")
    files = list(out.rglob("part-*.parquet"))
    rows = sum(pq.read_metadata(p).num_rows for p in files)
    lines += [f"rows={rows}", f"files={len(files)}", f"bytes={sum(p.stat().st_size for p in files)}"]
    print("\n".join(lines), flush=True)
    turns = sorted(set(read_table(out, run, columns=["turn"])["turn"].to_pylist()))
    fill = {"out": str(out), "run": run, "code": str(code), "turns": turns}
    steps = [(s, s) for s in args.steps.split(",") if s in STEPS]
    if "compact" in args.steps.split(","):
        if (code / "jobs" / "compact.py").exists():
            steps.append(("summarize_compacted", "summarize"))  # the same report on the compacted run
        else:
            steps.remove(("compact", "compact"))
    for name, step in steps:
        seconds, peak, last = measured([a.format(**fill) for a in STEPS[step]])
        line = f"{name}_s={seconds:.1f} {name}_peak_mb={peak:.0f}  # {last[:100]}"
        print(line, flush=True)
        lines.append(line)
    log = Path(args.log_dir) / f"scale-{args.rows}{'-' + args.label if args.label else ''}-" \
                               f"{time.strftime('%Y%m%dT%H%M%S')}.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(lines) + "\n")
    print(f"log: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
