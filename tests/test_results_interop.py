"""The results directory reads the same rows with every common reader: ours, pandas,
pyarrow.parquet, pyarrow.dataset with hive partitioning, and DuckDB and polars when installed
(hub ids with '/' and ':' in partition values included)."""
from __future__ import annotations

import importlib.util

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


def readers(out) -> dict:
    found = {
        "ours": lambda: read_results(out),
        "pandas": lambda: pd.read_parquet(out),
        "pyarrow.parquet": lambda: pq.read_table(out).to_pandas(),
        "pyarrow.dataset hive": lambda: ds.dataset(out, format="parquet", partitioning="hive").to_table().to_pandas(),
    }
    if importlib.util.find_spec("duckdb"):
        import duckdb

        found["duckdb"] = lambda: duckdb.sql(
            f"SELECT * FROM read_parquet('{out}/**/*.parquet', hive_partitioning = true)").df()
    if importlib.util.find_spec("polars"):
        import polars

        found["polars"] = lambda: polars.read_parquet(f"{out}/**/*.parquet", hive_partitioning=True).to_pandas()
    return found


def test_every_reader_gets_the_same_rows(results_dir):
    expected = normalised(read_results(results_dir))
    assert len(expected) == 6 and {row[2] for row in expected} == {"llava-hf/llava-1.5-7b-hf", "tiny:target"}
    for name, read in readers(results_dir).items():
        assert normalised(read()) == expected, name
