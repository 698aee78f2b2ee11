"""ray_cluster.yaml passes the cluster launcher's own schema check (as `ray up` would run it)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
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


def test_the_cluster_keeps_authentication_on_and_its_job_api_on_loopback():
    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)
    head = next(c for c in config["head_start_ray_commands"] if "ray start" in c)
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in (REPO / "ray_cluster.yaml").read_text()
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"  # every node gets the token
    for doc in ("README.md", "docs/cluster.md", "scripts/local_ray.sh"):
        assert "RAY_AUTH_MODE=disabled" not in (REPO / doc).read_text(), doc  # never advised


# GPU memory of the instance types a config may name (one GPU each), in GB
GPU_MEMORY_GB = {"g5.2xlarge": 24, "g5.4xlarge": 24, "g6e.xlarge": 48, "g6e.2xlarge": 48, "p4d.24xlarge": 40}


def needed_gb(model: str, dtype: str) -> float:
    """A target's weights (2 bytes per parameter in fp16/bf16, 4 in fp32) plus ~15% for the
    draft and the KV caches; the size is read from the hub id (`-7b-`, `-13b-`)."""
    billions = float(re.search(r"(\d+(?:\.\d+)?)b\b", model.lower().replace("-hf", "")).group(1))
    return billions * (4 if dtype == "fp32" else 2) * 1.15


def test_every_gpu_worker_fits_every_target_of_the_paper_grid():
    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    assert "py311" in config["docker"]["image"]  # Python >= 3.10 whatever the AMI's OS
    grid = yaml.safe_load((REPO / "configs" / "paper_full.yaml").read_text())
    largest = max(needed_gb(pair["target"], pair.get("dtype", "fp32")) for pair in grid["pairs"])
    assert largest == pytest.approx(13 * 2 * 1.15)
    for name, node in config["available_node_types"].items():
        if name != config["head_node_type"]:
            assert GPU_MEMORY_GB[node["node_config"]["InstanceType"]] >= largest, name
