"""The Parquet results dataset: documented schema, atomic shard files, resume keys, and the
first-turn answers that second turns are built from."""
from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.decoding.config import DecodeConfig
from pipeline.data.sample import Sample
from pipeline.drafting.policies import GridSearchPolicy
from pipeline.decoding.records import SampleRecord
from pipeline.planning.grid import Pair, RunConfig, row_key
from pipeline.storage.schema import FILE_SCHEMA, SCHEMA, make_row
from pipeline.storage.store import read_results, rows_to_table, turn_answers, write_shard, written_rows

PAIR = Pair("llava-hf/llava-1.5-7b-hf", "mjbooo/lvlm68m", "fp16")
DOCUMENTED = (
    "key sample_id dataset turn target draft methods policy window distance gamma temperature seed mode engine "
    "accepted_per_block weights_per_block blocks tau new_tokens output_ids output_text time_total_s time_tabed_s error"
).split()


def record(sample_id: str, text: str = "a cat", error: str | None = None) -> SampleRecord:
    if error:
        return SampleRecord(sample_id=sample_id, error=error)
    return SampleRecord(
        sample_id=sample_id, output_ids=[5, 6, 7], output_text=text, accepted_per_block=[2, 0],
        weights_per_block=[[0.5, 0.5], [0.7, 0.3]], time_total_s=0.25, engine="static", time_tabed_s=0.05,
    )


def written_keys(out, run: str) -> set[str]:
    return {row["key"] for row in written_rows(out, run, ["first"])}


def sample_at(i: int, turn: str = "first") -> Sample:
    return Sample("pope", "test", i, turn, "USER: <image>\nq? ASSISTANT:")


def shard_rows(config: RunConfig, turn: str = "first", n: int = 3, shard: str = "s1", error_row: int | None = None) -> list[dict]:
    rows = []
    for i in range(n):
        sample = sample_at(i, turn)
        rec = record(sample.sample_id, f"answer {i}", "ValueError: bad" if i == error_row else None)
        rows.append(make_row("r", shard, config, sample, rec))
    return rows


def test_rows_follow_the_documented_schema(tmp_path):
    config = RunConfig(PAIR, DecodeConfig("MT", GridSearchPolicy(window=4), gamma=5, max_new_tokens=64))
    path = write_shard(tmp_path, rows_to_table(shard_rows(config, error_row=2)))
    assert path.name == "part-s1.parquet"
    assert path.parent.relative_to(tmp_path).as_posix() == (
        "run=r/target=llava-hf%2Fllava-1.5-7b-hf/draft=mjbooo%2Flvlm68m/dataset=pope"
    )
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    table = pq.read_table(path)
    assert table.schema.equals(FILE_SCHEMA)  # the partition columns are its directory names
    assert set(SCHEMA.names) - set(FILE_SCHEMA.names) == {"run", "target", "draft", "dataset"}
    assert set(DOCUMENTED) <= set(SCHEMA.names)
    df = read_results(tmp_path)
    row = df.iloc[0]
    assert row.target == PAIR.target and row.dataset == "pope" and row.method_label == "MT*"
    assert row.policy == "grid(hard+soft)" and row.window == 4 and row.distance == "kl" and row.gamma == 5
    assert list(row.accepted_per_block) == [2, 0] and row.tau == 2.0 and row.blocks == 2 and row.new_tokens == 3
    assert [list(w) for w in row.weights_per_block] == [[0.5, 0.5], [0.7, 0.3]]
    assert row.key == row_key(config.key(), "pope/test/0/first", sample_at(0).prompt_hash) and pd.isna(row.error)
    assert row.engine == "static" and row.time_tabed_s == 0.05
    failed = df.iloc[2]
    assert failed.error == "ValueError: bad" and pd.isna(failed.tau) and failed.blocks == 0
    # the whole directory is readable by plain pandas too (hive partitions match the columns)
    assert len(pd.read_parquet(tmp_path)) == 3


def test_unused_fields_are_null_for_ar_and_static():
    ar = shard_rows(RunConfig(PAIR, DecodeConfig("AR", gamma=None)))[0]
    assert ar["gamma"] is None and ar["window"] is None and ar["distance"] is None and ar["policy"] == "static"
    static = shard_rows(RunConfig(PAIR, DecodeConfig("MT")))[0]
    assert static["method_label"] == "MT" and static["distance"] is None and static["measure"] is None


def test_error_rows_name_the_engine_the_grid_asked_for():
    assert shard_rows(RunConfig(PAIR, DecodeConfig("M"), engine="eager"), error_row=0)[0]["engine"] == "eager"
    assert shard_rows(RunConfig(PAIR, DecodeConfig("M")), error_row=0)[0]["engine"] is None  # auto: nothing ran, nothing known
    assert shard_rows(RunConfig(PAIR, DecodeConfig("M"), engine="eager"))[0]["engine"] == "static"  # what ran wins


def test_results_written_before_engine_columns_still_read(tmp_path):
    config = RunConfig(PAIR, DecodeConfig("M"))
    path = write_shard(tmp_path, rows_to_table(shard_rows(config)))
    old = pq.read_table(path).drop_columns(["engine", "time_tabed_s"])
    pq.write_table(old, path)
    assert pq.read_schema(path).get_field_index("engine") == -1
    df = read_results(tmp_path)
    assert len(df) == 3 and df["engine"].isna().all() and df["time_tabed_s"].isna().all()
    assert list(df.columns) == SCHEMA.names and df.output_text.iloc[0] == "answer 0"
    assert written_keys(tmp_path, "r") == {row_key(config.key(), f"pope/test/{i}/first", sample_at(i).prompt_hash) for i in range(3)}
    new = RunConfig(PAIR, DecodeConfig("T"))
    write_shard(tmp_path, rows_to_table(shard_rows(new, shard="s2")))  # old and new files side by side
    both = read_results(tmp_path)
    assert len(both) == 6 and both.groupby("methods")["engine"].count().to_dict() == {"M": 0, "T": 3}
    assert pa.types.is_float64(SCHEMA.field("time_tabed_s").type)


def test_written_rows_ignore_unfinished_temporary_files(tmp_path):
    config = RunConfig(PAIR, DecodeConfig("M"))
    path = write_shard(tmp_path, rows_to_table(shard_rows(config)))
    (path.parent / ".part-s2.parquet.123.tmp").write_bytes(b"half a file")
    keys = written_keys(tmp_path, "r")
    assert keys == {row_key(config.key(), f"pope/test/{i}/first", sample_at(i).prompt_hash) for i in range(3)}
    assert written_keys(tmp_path, "other-run") == set()
    assert len(read_results(tmp_path)) == 3


def test_first_turn_answers_come_from_greedy_error_free_rows_of_the_target(tmp_path):
    greedy = RunConfig(PAIR, DecodeConfig("M", max_new_tokens=64))
    write_shard(tmp_path, rows_to_table(shard_rows(greedy, shard="a", error_row=1)))
    sampled = RunConfig(PAIR, DecodeConfig("M", temperature=0.7, max_new_tokens=64))
    write_shard(tmp_path, rows_to_table([{**r, "output_text": "sampled"} for r in shard_rows(sampled, shard="b")]))
    other = RunConfig(Pair("llava-hf/llava-1.5-13b-hf", "mjbooo/lvlm68m", "fp16"), DecodeConfig("M", max_new_tokens=64))
    write_shard(tmp_path, rows_to_table([{**r, "output_text": "13b"} for r in shard_rows(other, shard="c")]))
    answers = turn_answers(tmp_path, "r", target=PAIR.target, dtype="fp16", dataset="pope", turn="first",
                           max_new_tokens=64)
    assert answers == {"pope/test/0/first": "answer 0", "pope/test/2/first": "answer 2"}
    assert turn_answers(tmp_path, "r", target=PAIR.target, dtype="fp16", dataset="pope", turn="first",
                        max_new_tokens=32) == {}
