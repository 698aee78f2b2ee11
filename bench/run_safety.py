"""How a run survives trouble, measured on the smoke grid with the real job (`jobs/full_grid.py`
in a subprocess, local Ray): resume after a changed `limit`, two drivers on one run, Ctrl-C and
SIGKILL mid-run then resume, and a list of bad inputs that must fail before Ray starts.

    python bench/run_safety.py            # about 5 minutes on 2 CPU cores

Prints `name=value` lines: rows lost and rows duplicated against an undisturbed run (both
must be 0), bad inputs caught before Ray, and the slowest of those checks in seconds.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.storage.store import read_results  # noqa: E402

ENV = {**os.environ, "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
RESULT_COLUMNS = ["key", "output_ids", "accepted_per_block", "weights_per_block", "error"]


def smoke(tmp: Path, name: str, **changes) -> Path:
    grid = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    grid.update(calibrate=False, **changes)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def job(grid: Path, out: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "jobs/full_grid.py", "--grid", str(grid), "--out", str(out), "--run", "smoke"],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(process: subprocess.Popen) -> tuple[int, str]:
    out, err = process.communicate(timeout=900)
    return process.returncode, out + err


def rows(out: Path) -> dict[str, str]:
    df = read_results(out, "smoke")
    return ({row["key"]: json.dumps([str(row[c]) for c in RESULT_COLUMNS]) for _, row in df.iterrows()}
            | {"_n": str(len(df))})


def compare(name: str, got: Path, want: Path) -> tuple[int, int]:
    df = read_results(got, "smoke")
    good, seen = rows(want), rows(got)
    duplicated = len(df) - df["key"].nunique()
    lost = sum(1 for key, value in good.items() if key != "_n" and seen.get(key) != value)
    print(f"{name}_rows={len(df)}\n{name}_rows_lost={lost}\n{name}_rows_duplicated={duplicated}")
    return lost, duplicated


def interrupted(tmp: Path, grid: Path, sig: int, after_files: int) -> Path:
    out = tmp / f"sig{sig}"
    process = job(grid, out, start_new_session=True)
    deadline = time.monotonic() + 600
    while len(list(out.rglob("part-*.parquet"))) < after_files and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(process.pid, sig)
    finish(process)
    code, _ = finish(job(grid, out))
    assert code == 0
    return out


BAD_INPUTS = {
    "yaml_typo": "name: x\ndatasets: [embedded_vqa\n",
    "nan_temperature": {"temperature": [0.0, float("nan")]},
    "inf_temperature": {"temperature": [float("inf")]},
    "duplicate_dataset": {"datasets": ["embedded_vqa", "embedded_vqa"]},
    "unknown_policy_field": {"policies": [{"kind": "static", "measure": "hard"}]},
    "missing_model_dir": {"pairs": [{"target": "/no/such/model", "draft": "tiny:draft"}]},
    "dir_not_a_model": {"pairs": [{"target": "{tmp}", "draft": "tiny:draft"}]},
    "hub_id_not_cached_offline": {"pairs": [{"target": "nobody/uncached-llava", "draft": "tiny:draft"}]},
    "source_on_embedded_dataset": {"sources": {"embedded_vqa": "{tmp}"}},
    "source_not_parquet": {"datasets": ["docvqa"], "sources": {"docvqa": "{tmp}"}},
    "unwritable_out": {},
}


def bad_inputs(tmp: Path) -> None:
    caught, slowest = 0, 0.0
    for name, change in BAD_INPUTS.items():
        grid, out = tmp / f"bad-{name}.yaml", tmp / f"out-{name}"
        if isinstance(change, str):
            grid.write_text(change)
        else:
            grid = smoke(tmp, f"bad-{name}", **json.loads(json.dumps(change).replace("{tmp}", str(tmp))))
        if name == "unwritable_out":
            out.write_text("a file where the results directory should go")
        start = time.monotonic()
        code, log = finish(job(grid, out))
        seconds = time.monotonic() - start
        before_ray = (code == 2 and "Started a local Ray instance" not in log
                      and len(log.strip().splitlines()) == 1)
        caught += before_ray
        slowest = max(slowest, seconds)
        print(f"bad_input_{name}_exit={code}\nbad_input_{name}_seconds={seconds:.1f}")
    print(f"bad_inputs_tried={len(BAD_INPUTS)}\nbad_inputs_caught_before_ray={caught}\n"
          f"bad_input_slowest_seconds={slowest:.1f}")


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        bad_inputs(tmp)
        small, large = smoke(tmp, "limit4", limit=4), smoke(tmp, "limit6", limit=6)
        assert finish(job(large, tmp / "fresh6"))[0] == 0
        assert finish(job(small, tmp / "resumed"))[0] == 0
        code, log = finish(job(large, tmp / "resumed"))
        recomputed = next((line for line in log.splitlines() if "computed again" in line), "none")
        print(f"limit_change_exit={code}\nlimit_change_log={recomputed.strip()!r}")
        compare("limit_change", tmp / "resumed", tmp / "fresh6")

        first, second = job(small, tmp / "two"), None
        while not (tmp / "two" / "run=smoke" / ".lock").exists() and first.poll() is None:
            time.sleep(0.1)
        second = job(small, tmp / "two")
        code2, log2 = finish(second)
        code1, _ = finish(first)
        print(f"two_drivers_first_exit={code1}\ntwo_drivers_second_exit={code2}")
        print(f"two_drivers_second_said={log2.strip().splitlines()[-1]!r}")
        assert finish(job(small, tmp / "fresh4"))[0] == 0
        compare("two_drivers", tmp / "two", tmp / "fresh4")
        compare("ctrl_c_then_resume", interrupted(tmp, small, signal.SIGINT, 3), tmp / "fresh4")
        compare("sigkill_then_resume", interrupted(tmp, small, signal.SIGKILL, 3), tmp / "fresh4")


if __name__ == "__main__":
    main()
