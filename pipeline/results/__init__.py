"""What a run leaves behind and how it is read: `schema` (every result column, defined once),
`store` (the hive-partitioned Parquet dataset: write a shard atomically, read it back),
`report` (the paper's tables), `plots`, `summary` (summary.md with tables and figures) and
`calibration` (the draft/target latency ratio the speedup column uses)."""
