"""What the runner reads off Ray: the live nodes a worker fits on, a whole node's CPUs, and
the root cause in a remote failure's text."""
from __future__ import annotations

import re

import ray


def fitting_nodes(gpus: float, cpus: float) -> list[dict]:
    """Live nodes with at least `gpus` GPUs and `cpus` CPUs (Ray must be initialised)."""
    return [
        node for node in ray.nodes()
        if node.get("Alive") and node["Resources"].get("GPU", 0.0) >= gpus
        and node["Resources"].get("CPU", 0.0) >= cpus
    ]


def cpu_slots(cpus: float) -> int:
    """How many workers of `cpus` CPUs the live nodes can hold, node by node (a worker never
    spans two nodes, so pooled CPUs would overcount on unequal nodes)."""
    return sum(int(node["Resources"].get("CPU", 0.0) // cpus) for node in fitting_nodes(0.0, cpus))


def node_cpus() -> float:
    """The CPUs of the largest live node: what a worker or task takes to have a node to itself."""
    return max((node["Resources"].get("CPU", 1.0) for node in fitting_nodes(0.0, 0.0)), default=1.0)


def last_error_line(err: BaseException) -> str:
    """The root cause of a remote failure in one line: the last `SomeError: message` line of
    Ray's text (which carries the remote traceback), else its first line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b", line)]
    return (causes or lines or [type(err).__name__])[-1 if causes else 0]
