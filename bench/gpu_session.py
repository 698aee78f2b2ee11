"""Everything a lent GPU is asked to measure, as ONE prepared run that fits its budget: the README's
main path through Ray on the GPU, the profile of a 7B target step and an SD block, and the GPU check
on the Qwen2.5-VL 7B/3B shapes, each stage stopped at its share of `--budget-s`, every raw log
written to `--log-dir` as it goes.

    python bench/gpu_session.py --budget-s 420 --log-dir $OUT --wheels .whl

Stages, in order (a stage that outruns its share is stopped and says so; the next one starts):
1. `wheels`: what the device image lacks (Ray, datasets, a newer transformers, the embedded
   scenarios' images), installed from `--wheels` into a private folder on PYTHONPATH: `*.whl`
   files, and `*.tar.xz` archives of a package's folders (`scripts/gpu_wheels.py` builds them all:
   docs/engine.md, "On a lent GPU: one prepared run");
2. `smoke`: `jobs/full_grid.py --grid configs/smoke.yaml` (a local Ray that sees the GPU places
   one actor per GPU; the static engine compiles and captures its steps inside the actor), then
   `bench/grid_rows.py` over its rows: lossless count, device, engine, step modes, fallbacks;
3. `profile`: `bench/gpu_profile.py --shapes 7b` (LLaVA-1.5 7B target, 68M draft);
4. `check`: `bench/gpu_check.py --shapes 7b --family qwen2_5_vl --sections exact,decode`;
5. `heads`: `bench/gpu_check.py --shapes 7b --sections head` (an EAGLE head on the 7B-shaped LLaVA).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(tempfile.gettempdir()) / "tabed-site"
# (stage, share of the budget, the least worth starting with, in s)
NOISE = re.compile(r"^\s*(Loading weights|Writing model shards)")  # progress bars of every model built
STAGES = (("smoke", 0.30, 60), ("profile", 0.20, 60), ("check", 0.34, 90), ("heads", 0.16, 60))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=420.0, help="all stages together")
    parser.add_argument("--log-dir", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--wheels", type=Path, help="wheels and .tar.xz package folders to install first")
    parser.add_argument("--stages", type=lambda text: text.split(","), default=[s for s, _, _ in STAGES])
    parser.add_argument("--shapes", choices=["tiny", "7b"], default="7b", help="tiny: try it on a CPU")
    return parser.parse_args(argv)


class Log:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.file = path, path.open("w")

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def install(wheels: Path, log: Log) -> dict[str, str]:
    """The environment children run in: carried wheels and package folders on PYTHONPATH."""
    SITE.mkdir(parents=True, exist_ok=True)
    files = sorted(wheels.glob("*.whl"))
    if files:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(SITE),
                        *map(str, files)], check=True)
    for archive in sorted(wheels.glob("*.tar.xz")):
        with tarfile.open(archive) as tar:
            tar.extractall(SITE, filter="fully_trusted")  # our own archives, made by us
    log(f"# wheels: {len(files)} wheels, {len(list(wheels.glob('*.tar.xz')))} archives -> {SITE}")
    path = os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path}


def run(command: list[str], seconds: float, env: dict[str, str], log: Log) -> int | None:
    """`command`'s output into the log as it comes; None if it was stopped at `seconds`."""
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)

    def pump() -> None:
        for line in process.stdout:
            if line.strip() and not NOISE.match(line):
                log(line.rstrip())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        code = None
    reader.join(timeout=5)
    return code


VERSIONS = """import importlib.metadata as m, torch
print("device=" + (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"))
for name in ("torch", "transformers", "ray", "datasets", "pandas", "pyarrow", "numpy", "aiohttp",
             "accelerate"):
    try:
        print(f"version_{name}=" + m.version(name))
    except m.PackageNotFoundError:
        print(f"version_{name}=missing")
"""
ROWS_S = 25.0  # kept back from the smoke grid for reading its rows, whether or not the grid finished


def stage_commands(stage: str, args: argparse.Namespace, seconds: float,
                   scratch: Path) -> list[tuple[list[str], float]]:
    """The stage's commands, each with the seconds it may take."""
    python = sys.executable
    if stage == "smoke":
        out = scratch / "smoke"
        return [([python, "jobs/full_grid.py", "--grid", "configs/smoke.yaml", "--out", str(out)],
                 seconds - ROWS_S),
                ([python, "bench/grid_rows.py", str(out), "--run", "smoke"], ROWS_S)]
    if stage == "profile":
        return [([python, "bench/gpu_profile.py", "--shapes", args.shapes, "--log-dir", str(args.log_dir),
                  "--trace-dir", str(args.log_dir)], seconds)]
    family, sections, sizes = (("qwen2_5_vl", "exact,decode", "1,4") if stage == "check"
                               else ("llava", "head", "1"))
    return [([python, "bench/gpu_check.py", "--shapes", args.shapes, "--family", family, "--sections",
              sections, "--batch-sizes", sizes, "--budget-s", f"{max(seconds - 15, 30):.0f}",
              "--log-dir", str(args.log_dir)], seconds)]


def keep_summary(scratch: Path, log: Log) -> None:
    """The smoke grid's report, beside the logs (the rows themselves stay behind)."""
    summary = scratch / "smoke" / "_report-smoke" / "summary.md"
    if summary.is_file():
        kept = log.path.with_name(log.path.stem + "-smoke-summary.md")
        shutil.copy(summary, kept)
        log(f"# smoke report: {kept}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    log = Log(args.log_dir / f"gpu-session-{args.shapes}-{stamp}.txt")
    log(f"# command: python bench/gpu_session.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    env = install(args.wheels, log) if args.wheels else dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1",
               RAY_USAGE_STATS_ENABLED="0")
    run([sys.executable, "-c", VERSIONS], 60, env, log)
    stages = [stage for stage in STAGES if stage[0] in args.stages]
    carried = 0.0  # time a stage left unused passes on to the next
    with tempfile.TemporaryDirectory() as scratch:
        for i, (stage, share, least) in enumerate(stages):
            left = args.budget_s - (time.monotonic() - started)
            later = sum(s[2] for s in stages[i + 1:])  # what the later stages need at least
            seconds = left if i == len(stages) - 1 else min(left - later, share * args.budget_s + carried)
            if seconds < least:
                log(f"{stage}=unmeasured (no time left: {left:.0f} s for it and the stages after it)")
                continue
            log(f"# {stage}: up to {seconds:.0f} s, at {time.monotonic() - started:.0f} s")
            stage_start = time.monotonic()
            for command, allowed in stage_commands(stage, args, seconds, Path(scratch)):
                code = run(command, allowed, env, log)
                if code is None:
                    log(f"# {stage}: {command[1]} stopped at its {allowed:.0f} s (what it wrote follows)")
                elif code:
                    log(f"# {stage}: {' '.join(command[1:2])} exited {code}")
            if stage == "smoke":
                keep_summary(Path(scratch), log)
            carried = max(0.0, seconds - (time.monotonic() - stage_start))
            log(f"# {stage}: {time.monotonic() - stage_start:.0f} s")
    log(f"# session done in {time.monotonic() - started:.0f} s; kept: {log.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
