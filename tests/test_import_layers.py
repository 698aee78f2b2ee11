"""The code's layers import only downward, and no modules import each other in a circle.

Three wings, lowest first, then the entry points: the **core** (`pipeline.lookups`, the torch-free
draft-free drafters, then `pipeline.models`, `pipeline.drafting` and `pipeline.decoding`: no Ray,
no grid files), **planning** (samples
in `pipeline.data`, grids and shards in `pipeline.planning`, a shard's records computed in
`pipeline.execution`, what a run leaves behind in `pipeline.storage`, and the reports read from it
in `pipeline.reports`: no Ray), the **cluster** (`actors`: the Ray runner and the
worker), and the entry points (`jobs`). Imports inside functions count too: they are imports
all the same, only later.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# lowest first; a module may import its own layer and those below
LAYERS = (
    "pipeline.lookups", "pipeline.models", "pipeline.drafting", "pipeline.decoding",  # core
    "pipeline.data", "pipeline.planning", "pipeline.execution", "pipeline.storage", "pipeline.reports",
    "pipeline",  # planning
    "actors",  # cluster
    "jobs",
)
CORE = LAYERS[:4]
# leaf modules every layer may use: the value type the core decodes and the images it holds
# encoded (decoded where a sample runs), the "did you mean" helper, the plug-in registry
CORE_MAY_USE = {"pipeline.data.sample", "pipeline.data.images", "pipeline.names", "pipeline.registry"}


def module_files() -> dict[str, Path]:
    files = {}
    for package in ("pipeline", "actors", "jobs"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            files[name] = path
    return files


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (`from a import b` is `a.b` when that is a module)."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                assert node.level == 0, f"{path}: relative import"
                targets.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                               for a in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def layer(module: str) -> int:
    if module in CORE_MAY_USE:
        return 0
    return min(i for i, prefix in enumerate(LAYERS) if module == prefix or module.startswith(prefix + "."))


def test_imports_only_run_downward():
    graph = import_graph()
    upward = {(a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a)}
    assert not upward, upward


def test_no_import_cycles():
    graph = import_graph()
    cycles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, cycles


def test_the_checker_sees_an_upward_import():
    """Guard against a vacuous check: the core importing the grid would be caught."""
    assert layer("pipeline.grid") > layer("pipeline.decoding.loop") > layer("pipeline.drafting.policies")
    assert layer("pipeline.data.loading") > layer("pipeline.decoding.loop") == layer("pipeline.decoding.config")
    assert layer("pipeline.storage.schema") > layer("pipeline.planning.grid") > layer("pipeline.data.turns")
    assert "pipeline.planning.grid" in import_graph()["actors.runner"]  # function-level or not, edges are seen


def test_no_library_file_outgrows_one_reading():
    """Largest library module <= 300 lines: past that a file is doing more than one job."""
    sizes = {name: len(path.read_text().splitlines()) for name, path in module_files().items()}
    assert max(sizes.values()) <= 300, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_replay_scores_without_the_loop():
    """Replay runs the loop's block rule (`acceptance.settle_block`), never the loop itself: it
    must not import `pipeline.decoding.loop`, directly or through another module."""
    graph, seen, todo = import_graph(), set(), ["pipeline.decoding.replay"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    assert "pipeline.decoding.acceptance" in seen and "pipeline.decoding.loop" not in seen


def test_every_package_fits_110_columns():
    """Code reads on one screen: no line of the library, the Ray wing, the entry points, the
    benchmarks or the scripts is wider than 110 characters."""
    wide = [f"{path.relative_to(ROOT)}:{number}" for package in ("pipeline", "actors", "jobs", "bench", "scripts")
            for path in sorted((ROOT / package).rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 110]
    assert not wide, wide


def test_a_job_never_imports_another_job():
    """Entry points stay thin: what two jobs share is library code in a layer below them."""
    graph = import_graph()
    between = {(a, b) for a, targets in graph.items() if a.startswith("jobs.") for b in targets
               if b.startswith("jobs.")}
    assert not between, between
