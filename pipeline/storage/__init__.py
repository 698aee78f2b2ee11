"""What a run leaves behind and how it is read: `schema` (every result column, defined once),
`store` (the hive-partitioned Parquet dataset: write a shard atomically, read it back),
`manifest` (the grids written into a run and the rows each asks for), `run_lock` (one driver
per run) and `calibration_store` (each pair's measured step costs, read once into
`Calibrations`). Reports (`pipeline.reports`) read runs through it only."""
