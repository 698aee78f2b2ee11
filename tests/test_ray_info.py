"""What the runner reads off Ray's node list, on a made-up cluster of unequal nodes (no Ray started)."""
from __future__ import annotations

import actors.ray_info as ray_info


def test_workers_are_counted_node_by_node_and_a_whole_node_is_the_largest_live_one(monkeypatch):
    nodes = [
        {"Alive": True, "Resources": {"CPU": 16.0}},
        {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}},
        {"Alive": True, "Resources": {"CPU": 8.0}},
        {"Alive": False, "Resources": {"CPU": 64.0}},  # gone: counts for nothing
    ]
    monkeypatch.setattr(ray_info.ray, "nodes", lambda: nodes)
    assert ray_info.node_cpus() == 16.0
    assert ray_info.cpu_slots(16.0) == 1  # 32 CPUs in all, but only one node holds a 16-CPU worker
    assert ray_info.cpu_slots(1.0) == 32 and ray_info.cpu_slots(0.5) == 64
    assert [n["Resources"]["CPU"] for n in ray_info.fitting_nodes(1.0, 4.0)] == [8.0]


def test_the_root_cause_line_of_a_remote_failure():
    text = "ray.exceptions.RayTaskError: task failed\nTraceback ...\n  File x\nValueError: pairs[0]: no such model"
    assert ray_info.last_error_line(Exception(text)) == "ValueError: pairs[0]: no such model"
    assert ray_info.last_error_line(Exception("just words\nmore")) == "just words"
