"""What a researcher reads of a run, computed from `pipeline.storage`: `report` (the paper's tau
tables), `speedup` (Eq. 1 beside measured walltime), `plots`, the sections of `summary`
(summary.md with tables and figures) and `export` (other tools' formats)."""
