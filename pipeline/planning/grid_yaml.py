"""A grid file read as YAML with bounds, so a hostile or broken file is refused in milliseconds.

YAML's anchors and aliases let a few hundred bytes expand into billions of entries (the
"billion laughs" file): `yaml.safe_load` executes nothing, but it would build all of them and
take gigabytes. The file is composed into its node graph first (aliases stay shared, so this
is cheap), the size it would expand to is counted, and only a file within the limits is built.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pipeline.planning.grid import GridError

MAX_FILE_BYTES = 1 << 20  # a grid of thousands of entries is a few hundred kilobytes
MAX_EXPANDED_NODES = 100_000  # scalars, lists and mappings after every alias is expanded


def read_grid_yaml(path: Path) -> Any:
    """The document in `path`; GridError (one line) for a file that is unreadable, too large,
    not YAML, or that would expand past `MAX_EXPANDED_NODES`."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise GridError(f"grid file {path} is {size:,} bytes; "
                            f"a grid file holds at most {MAX_FILE_BYTES:,}")
        text = path.read_text()
    except OSError as err:
        raise GridError(f"cannot read grid file {path}: {err}") from err
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_size(node, {}, set())
        if expanded > MAX_EXPANDED_NODES:
            raise GridError(f"grid file {path} expands (through its YAML aliases) to more than "
                            f"{MAX_EXPANDED_NODES:,} entries; write the entries out, or use fewer aliases")
        return loader.construct_document(node)
    except yaml.YAMLError as err:  # one line: what is wrong and where
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise GridError(f"grid file {path} is not valid YAML{where}: {problem}") from err
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """Nodes `node` stands for once every alias is expanded, counting each shared node once per
    use (memoised, so a deep alias chain costs its length, not its expansion). Stops adding up
    past the limit; a node that contains itself counts as past it."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        return MAX_EXPANDED_NODES + 1  # a recursive alias: it has no finite expansion
    open_nodes.add(id(node))
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    total = 1
    for child in children:
        total += _expanded_size(child, sizes, open_nodes)
        if total > MAX_EXPANDED_NODES:
            break
    open_nodes.discard(id(node))
    sizes[id(node)] = total
    return total
