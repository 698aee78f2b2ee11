"""A grid file read as YAML with bounds, so a hostile or broken file is refused in milliseconds.

YAML's anchors and aliases let a few hundred bytes expand into billions of entries (the
"billion laughs" file): `yaml.safe_load` executes nothing, but it would build all of them and
take gigabytes. The file is composed into its node graph first (aliases stay shared, so this
is cheap), the size it would expand to is counted, and only a file within the limits is built.
Only a regular file is read (a FIFO would wait forever, /dev/zero never ends), at most
`MAX_FILE_BYTES` of it, as UTF-8; nesting is bounded (the composer recurses a few frames per
level), and so are integers' digits (Python refuses to convert past 4300 of them).
"""
from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from pipeline.planning.grid import GridError

MAX_FILE_BYTES = 1 << 20  # a grid of thousands of entries is a few hundred kilobytes
MAX_EXPANDED_NODES = 100_000  # scalars, lists and mappings after every alias is expanded
MAX_DEPTH = 32  # lists and mappings inside each other; a grid needs 4
MAX_INT_DIGITS = 30  # no field takes more (a 64-bit seed has 20)
INT_TAG = "tag:yaml.org,2002:int"


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader refusing nesting past `MAX_DEPTH` before its recursion runs out of stack."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise GridError(f"grid file {self.name} nests lists or mappings more than {MAX_DEPTH} deep "
                                f"(line {mark.line + 1}, column {mark.column + 1})")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _text(path: Path) -> str:
    """A regular file's text: at most `MAX_FILE_BYTES`, UTF-8; GridError otherwise."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise GridError(f"grid file {path} is not a regular file (a directory, device or pipe); "
                            "name a .yaml file")
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise GridError(f"cannot read grid file {path}: {err}") from err
    if len(data) > MAX_FILE_BYTES:
        raise GridError(f"grid file {path} is larger than {MAX_FILE_BYTES:,} bytes; "
                        f"a grid file holds at most {MAX_FILE_BYTES:,}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GridError(f"grid file {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                        f"{err.start}); save it as UTF-8") from None


def read_grid_yaml(path: Path) -> Any:
    """The document in `path`; GridError (one line) for a file that is not a regular file,
    unreadable, too large, not UTF-8, not YAML, nested too deep, holds an integer of too many
    digits, or would expand past `MAX_EXPANDED_NODES`."""
    loader = _BoundedLoader(_text(path))
    loader.name = str(path)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_size(node, {}, set())
        if expanded > MAX_EXPANDED_NODES:
            raise GridError(f"grid file {path} expands (through its YAML aliases) to more than "
                            f"{MAX_EXPANDED_NODES:,} entries; write the entries out, or use fewer aliases")
        _check_integers(node, "", set())
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


def _check_integers(node: yaml.Node, where: str, seen: set[int]) -> None:
    """GridError naming the entry (`seed[0]`, `policies[1].steps`) of an integer longer than
    `MAX_INT_DIGITS`; each node is looked at once (aliases share theirs)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        digits = len(node.value.lstrip("+-").replace("_", ""))
        if node.tag == INT_TAG and digits > MAX_INT_DIGITS:
            raise GridError(f"{where or 'grid file'}: an integer of {digits} digits (line "
                            f"{node.start_mark.line + 1}); a grid's numbers have at most {MAX_INT_DIGITS}")
    elif isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            _check_integers(child, f"{where}[{i}]", seen)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name = key.value[:40] if isinstance(key, yaml.ScalarNode) else "?"
            _check_integers(key, where or "grid file", seen)
            _check_integers(value, f"{where}.{name}" if where else name, seen)
