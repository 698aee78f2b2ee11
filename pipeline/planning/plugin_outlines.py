"""A grid's plugin read from its source instead of run: what `--dry-run` and `--list` know of
the classes a grid names by import path, so that planning a grid executes none of its modules.

The class is found in its module's syntax tree; its class keywords (`letter=`, `kind=`), the
literal values of its class attributes, its fields (annotated names, literal defaults) and its
docstring make an outline: a subclass of the library base (or of the library class it extends)
under the same import path, registered like the real class would be. The grid is then checked
and planned as it will run, but a field's value is only checked by the plugin's own `validate`
when the grid runs, because that is code of the module's."""
from __future__ import annotations

import ast
import importlib
import types
from dataclasses import dataclass, is_dataclass
from typing import Any

from pipeline.planning.grid import GridError

LIBRARY = "pipeline"  # bases imported from here are the library's own: importing them runs no user code


def literal(node: ast.AST | None) -> tuple[bool, Any]:
    """(True, value) when `node` is a Python literal, else (False, None)."""
    if node is None:
        return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _library_import(tree: ast.Module, name: str) -> type | None:
    """The library class bound to `name` by `from pipeline.x import Name [as name]`, if any."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == LIBRARY:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    found = getattr(importlib.import_module(node.module), alias.name, None)
                    return found if isinstance(found, type) else None
    return None


def _parent(tree: ast.Module, cls: ast.ClassDef, module_name: str, base: type, where: str) -> type:
    """The class the outline extends: a base defined in the same module (outlined too) or
    imported from the library; the library `base` itself when a base cannot be read without
    running code. GridError when the class plainly does not extend `base`."""
    unread = False
    for node in cls.bases:
        name = node.id if isinstance(node, ast.Name) else None
        local = next((c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == name), None)
        if local is not None and local is not cls:
            found = outline_class(tree, local, module_name, base, where)
        else:
            found = _library_import(tree, name) if name else None
        if found is None:
            unread = True
        elif issubclass(found, base):
            return found
    if unread:
        return base
    raise GridError(f"{where}: '{module_name}:{cls.name}' is not a {base.__name__} subclass")


def outline_class(tree: ast.Module, cls: ast.ClassDef, module_name: str, base: type, where: str) -> type:
    """The outline of class `cls` of module `module_name` (parsed as `tree`); see the module."""
    parent = _parent(tree, cls, module_name, base, where)
    keywords = {}
    for keyword in cls.keywords:
        ok, value = literal(keyword.value)
        if keyword.arg is None or not ok:
            raise GridError(f"{where}: '{module_name}:{cls.name}' gives {keyword.arg or '**'}= as an "
                            "expression; --dry-run and --list read a plugin without running it, so write "
                            "it as a literal (letter=\"G\")")
        keywords[keyword.arg] = value
    namespace: dict[str, Any] = {"__module__": module_name, "__qualname__": cls.name,
                                 "__doc__": ast.get_docstring(cls), "__annotations__": {}}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if "ClassVar" in ast.unparse(node.annotation):
                namespace[node.target.id] = literal(node.value)[1]
            else:  # a field; a default that is code reads as None (the real class checks it)
                namespace["__annotations__"][node.target.id] = Any
                namespace[node.target.id] = literal(node.value)[1]
        elif isinstance(node, ast.Assign) and [type(t) for t in node.targets] == [ast.Name]:
            ok, value = literal(node.value)
            if ok:
                namespace[node.targets[0].id] = value
    made = types.new_class(cls.name, (parent,), keywords, lambda body: body.update(namespace))
    return dataclass(frozen=True)(made) if is_dataclass(parent) else made
