"""What a grid run's rows say about where and how they ran, as `name=value` lines: rows and failed
rows, the lossless audit (greedy SD rows equal to their AR row), and the devices, engines, step
modes and fallbacks the rows name. Used after a grid on a lent GPU, where the question is whether
actors placed on the GPU ran captured steps and stayed lossless.

    python bench/grid_rows.py /tmp/smoke --run smoke
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.reports.audit import lossless_table  # noqa: E402
from pipeline.storage.store import read_results  # noqa: E402

SHOWN = ("device_name", "engine", "mode", "steps", "fallback")  # counted per value


def figures(out: Path, run: str | None) -> dict[str, object]:
    rows = read_results(out, run)
    failed = rows["error"].notna()
    table = lossless_table(rows)
    found = {"rows": len(rows), "failed": int(failed.sum()),
             "lossless": f"{int(table['equal to AR'].sum())}/{int(table['rows'].sum())}"}
    for _, group in table.iterrows():
        found[f"lossless[{group['target']} <- {group['draft']}, {group['dtype']}, {group['engine']}]"] = \
            f"{int(group['equal to AR'])}/{int(group['rows'])}"
    for column in SHOWN:
        counts = rows[column].astype(object).fillna("none").value_counts()
        found[column] = "; ".join(f"{value} x{count}" for value, count in counts.items())
    if failed.any():
        found["errors"] = "; ".join(sorted(set(rows.loc[failed, "error"].astype(str).str[:160])))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the grid's --out folder")
    parser.add_argument("--run", help="one run of it (default: every run there)")
    args = parser.parse_args(argv)
    for name, value in figures(args.out, args.run).items():
        print(f"{name}={value}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
