"""The results directory reads the same rows with every common reader: ours, pandas,
pyarrow.parquet, pyarrow.dataset with hive partitioning, DuckDB and polars (the test extra installs
them), each with the call the docs give (hub ids with '/' and ':' in partition values included)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from pipeline.decoding.config import DecodeConfig
from pipeline.planning.grid import Pair, RunConfig
from pipeline.storage.store import read_results, rows_to_table, write_shard
from tests.test_results import shard_rows

COLUMNS = ["key", "run", "target", "draft", "dataset", "methods", "tau"]


@pytest.fixture
def results_dir(tmp_path):
    for i, (target, methods) in enumerate([("llava-hf/llava-1.5-7b-hf", "MT"), ("tiny:target", "M")]):
        pair = Pair(target, "mjbooo/lvlm68m")
        write_shard(tmp_path, rows_to_table(shard_rows(RunConfig(pair, DecodeConfig(methods)), shard=f"s{i}")))
    return tmp_path


def normalised(df: pd.DataFrame) -> list[tuple]:
    df = df[COLUMNS].astype({c: str for c in ("run", "target", "draft", "dataset")})
    return sorted(map(tuple, df.itertuples(index=False)))


# The calls docs/cluster.md gives, verbatim (OUT: the results folder). DuckDB and polars read
# every file a glob matches, underscore folders too (`_calibration/` holds Parquet of another
# shape), so their glob starts at the `run=` folders; pandas and pyarrow skip underscore folders.
DOCUMENTED_CALLS = {
    "pandas": 'pandas.read_parquet("OUT")',
    "pyarrow.dataset hive": 'pyarrow.dataset.dataset("OUT", format="parquet", partitioning="hive")'
                            '.to_table().to_pandas()',
    "duckdb": "duckdb.sql(\"SELECT * FROM read_parquet('OUT/run=*/**/*.parquet', hive_partitioning = true)\")"
              ".df()",
    "polars": 'polars.read_parquet("OUT/run=*/**/*.parquet", hive_partitioning=True).to_pandas()',
}


def readers(out) -> dict:
    import duckdb
    import polars
    import pyarrow

    found = {"ours": lambda: read_results(out), "pyarrow.parquet": lambda: pq.read_table(out).to_pandas()}
    scope = {"pandas": pd, "pyarrow": pyarrow, "duckdb": duckdb, "polars": polars}
    for name, call in DOCUMENTED_CALLS.items():
        found[name] = lambda call=call: eval(call.replace("OUT", str(out)), scope)
    return found


def test_every_reader_gets_the_same_rows(results_dir):
    """Beside a run's calibration, manifest and report folders, as a real run leaves them."""
    (results_dir / "_calibration").mkdir()
    calibration = results_dir / "_calibration" / "t--d--fp32.parquet"
    pd.DataFrame([{"target": "t", "ratio": 0.1}]).to_parquet(calibration)
    (results_dir / "_runs").mkdir()
    (results_dir / "_runs" / "run.json").write_text("{}")
    (results_dir / "_report-run").mkdir()
    (results_dir / "_report-run" / "tau.csv").write_text("a\n1\n")
    expected = normalised(read_results(results_dir))
    assert len(expected) == 6 and {row[2] for row in expected} == {"llava-hf/llava-1.5-7b-hf", "tiny:target"}
    for name, read in readers(results_dir).items():
        assert normalised(read()) == expected, name


def test_the_docs_give_each_reader_call_as_tested():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text()
    for name, call in DOCUMENTED_CALLS.items():
        assert call in docs, name
