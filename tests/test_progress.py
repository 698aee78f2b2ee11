"""The run's progress: counted in decodes (a replayed row costs a fraction of a live one), an
ETA from the smoothed rate, a line per shard in logs and a tqdm bar on a terminal."""
from __future__ import annotations

import io

import actors.progress as progress_module
from actors.progress import Progress, decodes
from pipeline.decoding.config import DecodeConfig
from pipeline.planning.grid import ModelGroup, Pair, RunConfig, Shard

PAIR = Pair("t", "d")
CONFIGS = [RunConfig(PAIR, DecodeConfig("AR", gamma=None))] + [RunConfig(PAIR, DecodeConfig(m)) for m in ("M", "T", "MT")]


def shard(mode: str, samples: int, configs=CONFIGS) -> Shard:
    ids = [f"x/test/{i}/first" for i in range(samples)]
    return Shard("r", ModelGroup("t", "fp32", ("d",)), "x", "first", mode, tuple((c, s) for s in ids for c in configs), tuple((s, "h") for s in ids))


def test_a_shard_costs_its_decodes():
    assert decodes(shard("replay", 3)) == 3  # one trace collection per sample scores every row
    assert decodes(shard("live", 2)) == 2 * 3 + 2  # every SD row, plus the target once per sample (AR)
    assert decodes(shard("live", 2, CONFIGS[1:])) == 2 * 3 + 2  # no AR row: the replay check decodes the target
    assert decodes(shard("live", 2, CONFIGS[:1])) == 2  # AR rows only


def test_log_lines_count_rows_and_estimate_from_decodes(monkeypatch):
    clock = iter([0.0, 10.0, 20.0])
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    shards = [shard("replay", 3), shard("live", 1), shard("replay", 3)]
    bar = Progress("first turn", shards, out)
    bar.advance(shards[0], 12)  # 3 decodes in 10 s: 0.3/s; 4 + 3 decodes left
    bar.advance(shards[1], 4)  # 4 decodes in 10 s: 0.3 * 0.4 + 0.7 * 0.3 = 0.33/s; 3 left
    lines = out.getvalue().splitlines()
    assert lines[0] == "[first turn] 1/3 shards, 12/28 rows, 0.30 decodes/s, ETA 0:00:24"
    assert lines[1] == "[first turn] 2/3 shards, 16/28 rows, 0.33 decodes/s, ETA 0:00:10"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar():
    out = Terminal()
    shards = [shard("replay", 2)]
    bar = Progress("second turn", shards, out)
    bar.advance(shards[0], 8)
    assert "[second turn]" in out.getvalue() and "decode" in out.getvalue() and "8/8 rows" in out.getvalue()
    assert "shards," not in out.getvalue()  # no log lines on a terminal
