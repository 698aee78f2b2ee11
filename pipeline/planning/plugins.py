"""What a grid file brings of its own: datasets named by path, drafting methods, weight
policies and verify kinds named by import path (`package.module:Class`).

Nothing in a grid file runs except the import paths written in `drafting_methods` and in a
policy's or verify entry's `kind`, and those only when the grid runs: each module's source is
first found on the Python path plus the current working directory (which is also where Ray
workers look: the job's working directory) and parsed, and a module that does not define the
class is refused unrun; then the module is imported by name, like `python -c "import
package.module"` would. `--dry-run` and `--list` import nothing: they read the class from its
source (`pipeline.planning.plugin_outlines`). The class must subclass the library's base
(`DraftingMethod`, `WeightPolicy`, `VerifySpec`), and is then used exactly like the built-ins.
"""
from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from pipeline.data.user_datasets import UserDataset, parse_user_dataset
from pipeline.drafting.methods import DraftingMethod
from pipeline.names import did_you_mean
from pipeline.planning.catalog import Catalog
from pipeline.planning.grid import GridError
from pipeline.planning.plugin_outlines import outline_class
from pipeline.planning.problems import Problems
from pipeline.registry import IMPORT_PATH_HINT


def import_class(path: Any, base: type, where: str, run: bool = True) -> type:
    """The class at `path` ('package.module:Class'), which must subclass `base`; GridError
    naming `where` when the path is malformed, the import fails or the class is wrong.
    `run=False`: its outline, read from the source, unless the module is already imported."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise GridError(f"{where}: expected {IMPORT_PATH_HINT}, got {path!r}")
    module_name, class_name = path.split(":")
    if os.getcwd() not in sys.path:  # as Ray workers resolve it: the job's working directory
        sys.path.append(os.getcwd())
    tree, node = class_source(module_name, class_name, where)
    if not run and module_name not in sys.modules:
        return outline_class(tree, node, module_name, base, where)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # a missing module, or one that raises on import
        raise GridError(f"{where}: cannot import {module_name!r}: {type(err).__name__}: {err}") from err
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, base)):
        raise GridError(f"{where}: {path!r} is not a {base.__name__} subclass")
    return found


def module_source(module_name: str) -> Path | None:
    """The source file `module_name` would be imported from, found on the Python path without
    importing anything (a package's parents included); None when it is no plain source file."""
    parts = module_name.split(".")
    for entry in sys.path:
        folder = Path(entry or ".").joinpath(*parts)
        for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def class_source(module_name: str, class_name: str, where: str) -> tuple[ast.Module, ast.ClassDef]:
    """The module's syntax tree and its top-level definition of `class_name`, read from its
    source without running it; GridError when it defines none: naming a grid's plugin must not
    run a module that is no plugin."""
    source = module_source(module_name)
    if source is None:
        raise GridError(f"{where}: no Python source file for module {module_name!r} on the path "
                        f"(a plugin is a .py file of yours, e.g. {IMPORT_PATH_HINT})")
    try:
        tree = ast.parse(source.read_bytes(), str(source))
    except (SyntaxError, ValueError) as err:
        raise GridError(f"{where}: {source} is not valid Python: {err}") from err
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return tree, node
    raise GridError(f"{where}: {source} defines no class {class_name!r} (nothing was imported)")


def load_drafting_methods(value: Any, run: bool = True) -> tuple[str, ...]:
    """`drafting_methods: ['pkg.mod:Class', ...]`: import each (`run=False`: outline each);
    each must register a letter."""
    paths = value if isinstance(value, list) else [value]
    for i, path in enumerate(paths):
        cls = import_class(path, DraftingMethod, f"drafting_methods[{i}]", run)
        if not cls.letter:
            raise GridError(f"drafting_methods[{i}]: {path!r} has no letter "
                            "(class X(DraftingMethod, letter='X'))")
    return tuple(paths)


def plugin_kind(kind: Any, base: type, where: str, run: bool = True) -> str:
    """A built-in kind as it is; an import path imports the class (`run=False`: outlines it),
    a `base` subclass, which registers itself as it is defined (`pipeline.registry`), and
    returns its kind (the path itself, unless the class named one: `kind="..."`)."""
    if not isinstance(kind, str) or ":" not in kind:
        return str(kind)
    return import_class(kind, base, where, run).kind


def parse_datasets(value: Any, catalog: Catalog,
                   base: Path | str = ".") -> tuple[tuple[str, ...], tuple[UserDataset, ...]]:
    """`datasets:` entries: registry names, or mappings that name a local file
    (`pipeline.data.user_datasets`; a relative path is read from `base`, the grid file's
    folder). Returns every name, in order, and the user datasets; every bad entry is reported."""
    entries = value if isinstance(value, list) else [value]
    if not entries:
        raise GridError("grid field 'datasets' is an empty list")
    names: list[str] = []
    users: list[UserDataset] = []

    def parse(entry: Any, i: int) -> None:
        if isinstance(entry, dict):
            try:
                user = parse_user_dataset(entry, f"datasets[{i}]", set(catalog.datasets) | set(names), base)
            except ValueError as err:
                raise GridError(str(err)) from err
            users.append(user)
            names.append(user.name)
        elif entry in catalog.datasets:
            names.append(entry)
        else:
            raise GridError(f"datasets[{i}]: unknown dataset {entry!r}"
                            f"{did_you_mean(entry, catalog.datasets)}; known: {sorted(catalog.datasets)} "
                            "(or a mapping with name and path for a file of your own)")

    problems = Problems()
    problems.each(entries, parse)
    problems.raise_all()
    return tuple(names), tuple(users)
