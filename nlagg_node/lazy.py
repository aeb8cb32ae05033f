"""Lazy re-exports for a package's ``__init__``, each name listed once.

The list is the package's ``if TYPE_CHECKING:`` block of ``from .module import name as name``
statements: type checkers and editors read those imports, and at run time :func:`lazy_exports`
reads the same statements from the package's source (parsed, nothing imported) and imports a
name's module only when the name is first used. So ``import adversary`` loads neither numba nor
matplotlib, and there is no second table to keep in step with the first.

Usage, after the ``TYPE_CHECKING`` block::

    __all__, __getattr__ = lazy_exports(__name__, __file__)
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["lazy_exports"]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def exported_names(init_file: str | Path) -> dict[str, str]:
    """``name -> submodule`` of every ``from .submodule import name`` under ``if TYPE_CHECKING:``."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    table: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module:
                    table.update((alias.asname or alias.name, stmt.module) for alias in stmt.names)
    return table


def lazy_exports(package: str, init_file: str) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` of ``package``: its sorted public names and the PEP 562 hook."""
    table = exported_names(init_file)

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's name is fixed by PEP 562
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module}", package), name)

    return sorted(table), __getattr__
