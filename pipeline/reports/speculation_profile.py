"""A run's acceptance as `speculation_profile.json`, schema 1.0 of NVIDIA's specdec_bench (in
NVIDIA/Model-Optimizer, `examples/specdec_bench/specdec_bench/speculation_profile.py`): the file
deployment tools read to replay a draft's acceptance (vLLM's synthetic rejection sampler takes
the marginal vector, Dynamo's mocker the conditional one).

One profile per cell: pair (target, draft, dtype), method label, policy, verify kind, gamma and
temperature, pooling every batch-1 row of the cell with accepted counts, live or replayed
(acceptance needs no walltime), every dataset and turn. A verify step emits an acceptance length
L = accepted drafts + 1 (the target's own token), so with K draft positions:

- `acceptance_length_histogram`: {L: steps};
- `marginal_accept_rates[i]` = P(L >= i + 2), the first i + 1 drafts all accepted;
- `conditional_accept_rates[i]` = P(L >= i + 2 | L >= i + 1), 0 where no step got that far;
- `mean_accept_length`: mean L per step, our pooled tau; `mean_accept_length_per_request` the
  mean over decodes (a sample and turn) of each one's own mean;
- `validation`: `mean_consistency` (1 + sum of the marginals against the measured mean, within
  0.02: a K cut short fails it) and `marginal_monotonicity` (a survival function never rises).
"""
from __future__ import annotations

from collections import Counter
from pathlib import PurePosixPath
from typing import Any, Iterable
from urllib.parse import quote

import pandas as pd

from pipeline.reports.report import PAIR, decoded_alone

SCHEMA_VERSION = "1.0"
CELL = [*PAIR, "method_label", "policy", "verify", "gamma", "temperature"]
CONSISTENCY_TOLERANCE = 0.02
# verify kinds whose accepted tokens are a prefix of one drafted chain; a tree accepts a path
# of its own, so its vectors describe that tree only and do not extrapolate to another K
CHAIN_KINDS = ("chain",)


def model_ref(name: str) -> dict[str, str]:
    """`{"id": ...}` of a model: a hub id or registry name as it is, a local folder by its last
    two parts (a published profile must not carry the cluster's paths)."""
    if name.startswith(("/", ".", "~")):
        return {"id": "/".join(PurePosixPath(name.replace("\\", "/")).parts[-2:])}
    return {"id": name}


def draft_positions(rows: pd.DataFrame) -> int:
    """K: the cell's draft positions, its gamma, or for a shape tree (a bandit's shapes) its
    deepest shape."""
    depths = [len(shape) for shapes in rows.get("verify_shapes", pd.Series(dtype=object))
              if hasattr(shapes, "__len__") for shape in shapes]
    gammas = [int(g) for g in rows["gamma"].dropna()]
    return max(depths + gammas)


def acceptance_vectors(lengths: Counter, positions: int) -> tuple[list[float], list[float]]:
    """(conditional, marginal) per draft position from a histogram of acceptance lengths."""
    steps = sum(lengths.values())
    reached = [sum(n for length, n in lengths.items() if length >= i + 1) / steps
               for i in range(positions + 1)]  # reached[i]: P(L >= i + 1)
    marginal = reached[1:]
    conditional = [reached[i + 1] / reached[i] if reached[i] else 0.0 for i in range(positions)]
    return conditional, marginal


def validations(mean_length: float, marginal: list[float]) -> dict[str, Any]:
    implied = 1.0 + sum(marginal)
    delta = abs(implied - mean_length)
    rises = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
             for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-9]
    return {"mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                 "reported_mean_accept_length": round(mean_length, 6),
                                 "abs_delta": round(delta, 6), "tolerance": CONSISTENCY_TOLERANCE,
                                 "passed": delta <= CONSISTENCY_TOLERANCE},
            "marginal_monotonicity": {"passed": not rises, "violations": rises}}


def histogram(blocks: Iterable) -> Counter:
    return Counter(int(accepted) + 1 for per_row in blocks for accepted in per_row)


def mean_of(lengths: Counter) -> float:
    """Mean acceptance length per verify step of a histogram."""
    return sum(length * n for length, n in lengths.items()) / sum(lengths.values())


def profile(cell: dict[str, Any], rows: pd.DataFrame) -> dict[str, Any]:
    """The schema-1.0 profile of one cell's rows."""
    positions = draft_positions(rows)
    lengths = histogram(rows["accepted_per_block"])
    mean_length = mean_of(lengths)
    per_request = [1 + sum(blocks) / len(blocks) for blocks in rows["accepted_per_block"] if len(blocks)]
    conditional, marginal = acceptance_vectors(lengths, positions)
    chain = cell["verify"] in CHAIN_KINDS
    per_dataset = {}
    for dataset, mine in rows.groupby("dataset", sort=True):
        counts = histogram(mine["accepted_per_block"])
        per_dataset[dataset] = {"mean_accept_length": round(mean_of(counts), 6),
                                "steps": sum(counts.values()), "requests": len(mine)}
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "method": cell["method_label"],
        "draft_checkpoint": model_ref(cell["draft"]),
        "target_model": model_ref(cell["target"]),
        "num_speculative_tokens": positions,
        "block_size": None,
        "max_supported_k": positions,
        "verification_method": "longest_prefix" if chain else "tree",
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": round(mean_length, 6),
        "mean_accept_length_per_request": round(sum(per_request) / len(per_request), 6),
        "accept_length_model": "chain_analytic" if chain else "measured_per_k",
        "accept_length_by_k": {str(positions): round(mean_length, 6)},
        "acceptance_length_histogram": {str(k): lengths[k] for k in sorted(lengths)},
        "per_category": per_dataset,
        "measurement_conditions": conditions(cell, rows),
        "validation": validations(mean_length, marginal),
    }


def conditions(cell: dict[str, Any], rows: pd.DataFrame) -> dict[str, Any]:
    """What the numbers were measured under, enough to read them without our results."""
    values = lambda column: sorted({str(v) for v in rows[column].dropna()}) if column in rows else []
    return {"producer": "tabed-pipeline (jobs/export.py --format speculation-profile)",
            "run": ", ".join(values("run")), "dtype": cell["dtype"], "policy": cell["policy"],
            "verify": cell["verify"], "gamma": cell["gamma"], "temperature": cell["temperature"],
            "engine": values("engine"), "device": values("device_name"), "datasets": values("dataset"),
            "turns": values("turn"), "modes": dict(Counter(rows["mode"])), "requests": len(rows),
            "steps": int(sum(len(blocks) for blocks in rows["accepted_per_block"]))}


def speculation_profiles(rows: pd.DataFrame) -> dict[str, dict]:
    """`<pair>/<cell>/speculation_profile.json` -> profile, for every cell with a verify step."""
    rows = decoded_alone(rows)
    sd = rows[rows["error"].isna() & (rows["mode"] != "ar")]
    sd = sd[sd["accepted_per_block"].map(len) > 0]
    sd = sd.assign(verify=sd["verify"].astype("str").fillna("chain") if "verify" in sd else "chain",
                   temperature=sd["temperature"].fillna(0.0),
                   policy=sd["policy"].astype("str").fillna("static"))
    files = {}
    for key, mine in sd.groupby(CELL, sort=True, dropna=False):
        cell = dict(zip(CELL, key))
        cell["gamma"] = None if pd.isna(cell["gamma"]) else int(cell["gamma"])
        cell["temperature"] = float(cell["temperature"])
        name = "__".join(quote(str(cell[c]), safe="") for c in ["method_label", "policy", "verify"])
        folder = "__".join(quote(str(cell[c]), safe="") for c in PAIR)
        files[f"{folder}/{name}__gamma-{cell['gamma']}__temperature-{cell['temperature']}"
              "/speculation_profile.json"] = profile(cell, mine)
    return files
