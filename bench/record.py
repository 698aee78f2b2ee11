"""Run a benchmark and keep its raw output under bench/results/, headed by where and how it ran.

    python bench/record.py bench/gpu_engine.py --shapes tiny
    python bench/record.py --label after-fusing bench/gpu_engine.py --shapes 7b --draft 68m

Every figure the docs quote comes from such a file: the header names the command, the UTC
date, the device, torch, transformers, Python and the git commit (with `+dirty` when the
tree had uncommitted changes), then the benchmark's own output follows unchanged. The output
is also printed as it comes.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def header(command: list[str], device: str) -> list[str]:
    from pipeline.models.devices import device_name, library_versions, processor_name

    versions = library_versions()
    machine = device_name(device) if device == "cuda" else f"cpu: {processor_name()} ({os.cpu_count()} cores)"
    return [
        f"# command: {' '.join(command)}",
        f"# date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
        f"# device: {machine}",
        f"# torch {versions['torch_version']}, transformers {versions['transformers_version']}, "
        f"python {platform.python_version()}",
        f"# commit: {commit()}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="", help="added to the file name, e.g. before / after")
    parser.add_argument("script", help="the benchmark script, e.g. bench/gpu_engine.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    command = ["python", args.script, *args.args]
    lines = header(command, device)
    print("\n".join(lines), flush=True)
    process = subprocess.Popen([sys.executable, args.script, *args.args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip("\n"))
    process.wait()
    lines.append(f"# exit status: {process.returncode}")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^A-Za-z0-9]+", "-",
                  " ".join([Path(args.script).stem, *args.args, args.label])).strip("-")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{slug}-{device}-{stamp}.txt"
    path.write_text("\n".join(lines) + "\n")
    print(f"# kept: {path.relative_to(ROOT)}")
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
