"""The documented commands can be run one after another as written: each grid run writes a
folder of its own (a second example writing into the first one's folder computes nothing: its
rows are already there), and every folder a report command reads was written by one of them."""
from __future__ import annotations

import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEFAULTS = {"--grid": "configs/embedded.yaml", "--out": "results", "--run": None}


def commands(path: Path) -> list[list[str]]:
    """Every command line of the file's fenced shell blocks, continuation lines joined."""
    found, fence, block = [], None, []
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            if fence is None:
                fence, block = line[3:].strip(), []
                continue
            if fence in ("bash", "sh"):
                for command in "\n".join(block).replace("\\\n", " ").splitlines():
                    command = command.split(" #", 1)[0].strip()
                    if command and not command.startswith("#"):
                        found.append(shlex.split(command))
            fence = None
        elif fence is not None:
            block.append(line)
    return found


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else DEFAULTS[name]


def grid_runs(path: Path) -> list[tuple[str, str, str | None]]:
    """(--out, --grid, --run) of each `jobs/full_grid.py` command that runs a grid."""
    runs = []
    for words in commands(path):
        if "jobs/full_grid.py" in words and not {"--dry-run", "--list"} & set(words):
            runs.append((option(words, "--out"), option(words, "--grid"), option(words, "--run")))
    return runs


def test_each_readme_example_writes_a_folder_of_its_own():
    runs = grid_runs(ROOT / "README.md")
    assert len(runs) >= 3
    outs = [out for out, _, _ in runs]
    assert len(set(outs)) == len(outs), runs


def test_a_folder_named_in_several_docs_is_always_the_same_grids():
    by_out: dict[str, set] = {}
    for path in DOCS:
        for out, grid, run in grid_runs(path):
            by_out.setdefault(out, set()).add((grid, run))
    assert all(len(grids) == 1 for grids in by_out.values()), by_out
