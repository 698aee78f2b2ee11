"""A run whose last node able to host a worker dies ends with a message instead of waiting
forever, and a rerun on a cluster that has such a node again resumes it: no row lost, none
written twice. Ray's own test cluster (`ray.cluster_utils.Cluster`) runs a head without GPUs
and a node with one logical GPU as separate processes on this machine."""
from __future__ import annotations

import io
import os
import time

import pytest

from actors.runner import GridRunner, RunFailed
from pipeline.storage.store import read_results
from tests.test_ray_grid import ToySource, spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray
    from ray.cluster_utils import Cluster

    saved = dict(os.environ)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # the nodes are this process's children: workers inherit these
    os.environ.update({"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1",
                       "TABED_TINY_DIR": str(tmp_path_factory.mktemp("tiny"))})
    cluster = Cluster(initialize_head=True, connect=True,
                      head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    os.environ.clear()
    os.environ.update(saved)


def test_losing_the_last_gpu_node_ends_the_run_and_a_rerun_resumes(cluster, tiny_dirs, tmp_path):
    import ray

    gpu_node = cluster.add_node(num_cpus=1, num_gpus=1)
    stream = io.StringIO()

    def lose_the_node(path, runner):
        if runner.report.shards_written == 1:
            cluster.remove_node(gpu_node, allow_graceful=False)
            # until Ray sees it gone: tiny shards could otherwise all finish on the dying node
            deadline = time.monotonic() + 60
            while any(n["Alive"] and n["Resources"].get("GPU") for n in ray.nodes()) and time.monotonic() < deadline:
                time.sleep(0.2)

    runner = GridRunner(spec(tiny_dirs), tmp_path, source=ToySource(), gpus_per_worker=1, stream=stream,
                        on_shard_written=lose_the_node, poll_s=1.0)
    with pytest.raises(RunFailed, match="no live node in the Ray cluster can host a worker"):
        runner.run()
    written = read_results(tmp_path)
    assert len(written) > 0 and written.key.is_unique

    cluster.add_node(num_cpus=1, num_gpus=1)
    report = GridRunner(spec(tiny_dirs), tmp_path, source=ToySource(), gpus_per_worker=1, stream=io.StringIO()).run()
    df = read_results(tmp_path)
    assert report.rows_skipped >= len(written) and df.key.is_unique
    assert len(df) == len(spec(tiny_dirs).units()) * 5
