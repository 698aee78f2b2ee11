"""ray_cluster.yaml passes the cluster launcher's own schema check (as `ray up` would run it)."""
from __future__ import annotations

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[1]


def test_cluster_config_is_valid_for_the_launcher():
    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    validate_config(prepare_config(config))
    workers = config["available_node_types"]["gpu_worker"]
    assert config["head_node_type"] == "head" and workers["max_workers"] >= workers["min_workers"] >= 1
    assert any("pip install -e ~/tabed" in c for c in config["setup_commands"])
    assert config["file_mounts"]["~/tabed"] == "."
