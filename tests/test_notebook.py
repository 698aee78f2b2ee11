"""The notebook and the README's pandas example on results shaped like the default job's (two
drafts, chains and candidate trees of the same ensembles, a second turn): both must show what
the report shows, never a pooling of their own."""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.storage.store import read_results
from pipeline.reports.summary import write_summary
from tests.results_fixture import RUN, write_results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def default_like(tmp_path_factory):
    out = write_results(tmp_path_factory.mktemp("default_like"))
    summary = write_summary(out, RUN, read_results(out, RUN))
    return out, summary


def executed_notebook(results: Path, tmp: Path) -> tuple[str, list[dict]]:
    """Run notebooks/analysis.ipynb headless as the README says (`jupyter execute`) over a
    results folder, the executed copy written under `tmp`: (its printed text, its outputs)."""
    import nbformat

    subprocess.run([sys.executable, "-m", "jupyter", "execute", f"--output={tmp / 'executed'}", "--timeout=300",
                    "notebooks/analysis.ipynb"], cwd=ROOT, check=True, capture_output=True, text=True,
                   env={**os.environ, "TABED_RESULTS": str(results)})
    notebook = nbformat.read(tmp / "executed.ipynb", as_version=4)
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs) + "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    return text, outputs


def test_the_readme_says_how_to_open_the_notebook_and_the_extra_installs_jupyter():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[notebook]"' in readme and "jupyter lab notebooks/analysis.ipynb" in readme
    assert "jupyter execute notebooks/analysis.ipynb" in readme
    extra = re.search(r"^notebook = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert extra and '"jupyterlab' in extra.group(1)


@pytest.mark.slow
def test_the_notebook_runs_clean_on_results_with_trees_two_drafts_and_a_second_turn(default_like, tmp_path):
    text, outputs = executed_notebook(default_like[0], tmp_path)
    assert "matches pipeline.reports.report.tau_table" in text
    assert "MT* (candidates)" in text and "embedded:small_draft" in text and "embedded:draft" in text and "qaorg" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2


def readme_pandas_example() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    found = [block for block in blocks if "read_parquet" in block]
    assert len(found) == 1, "the README has one pandas example"
    return found[0]


def test_the_readme_pandas_example_prints_numbers_the_report_shows(default_like):
    out, summary = default_like
    code = readme_pandas_example().replace('"results/', f'"{out}/')
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    numbers = re.findall(r"\d+\.\d\d", printed.getvalue())
    assert len(numbers) >= 4, printed.getvalue()
    tau_section = summary.split("## Block efficiency tau", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in tau_section.splitlines() if "| embedded:small_draft | fp32 | first |" in line and "(" not in line]
    shown = {value.strip("*") for line in rows for value in line.split(" | ")}
    assert set(numbers) <= shown, (numbers, rows)
