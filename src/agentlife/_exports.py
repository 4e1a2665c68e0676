"""A package's public names, read from its one import block.

A public package (`agentlife`, `agentlife.testing`) writes each public name once, as an explicit
re-export: ``from agentlife._agent import Done as Done``. Names whose modules are cheap are imported at the
top; names whose modules pull in more sit under ``if TYPE_CHECKING:``, where type checkers and the docs
read them and the interpreter does not. `Exports` reads that same block back from the package's source and
answers the two questions the interpreter still asks: where a lazy name lives (the package's
``__getattr__``) and what ``__all__`` holds. The source is parsed on the first such question, never by
``import agentlife`` itself, so the import stays as cheap as its eager block.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    import ast

__all__ = ["Exports", "publish", "ruff_sorted"]


def publish(obj: Any, namespace: str) -> Any:
    """Show the public path in tracebacks and docs: ``agentlife.Done``, not ``agentlife._agent.Done``."""
    module = getattr(obj, "__module__", None)
    if isinstance(module, str) and module.startswith("agentlife.") and "._" in module:
        with contextlib.suppress(AttributeError, TypeError):  # builtins and some protocols refuse it
            obj.__module__ = namespace
    return obj


def ruff_sorted(names: list[str]) -> list[str]:
    """``names`` in ruff's isort-style order for ``__all__``: SCREAMING_CASE, CamelCase, then the rest."""

    def key(name: str) -> tuple[int, str]:
        if name.isupper() and len(name) > 1:
            return (0, name)
        if name[:1].isupper():
            return (1, name)
        return (2, name)

    return sorted(names, key=key)


def _is_type_checking(node: ast.stmt) -> TypeGuard[ast.If]:
    import ast

    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def reexports(source: str) -> dict[str, str]:
    """Name -> module of every ``from M import X as X`` at the top level or under ``if TYPE_CHECKING:``.

    Only the redundant alias marks a name public (the form PEP 484 gives for an explicit re-export), so a
    helper the package imports for itself (``from typing import Any``) is never exported by accident.
    """
    import ast  # here, not at the top: `import agentlife` never parses, and ast costs ~5 ms to import

    tree = ast.parse(source)
    statements = list(tree.body)
    for node in tree.body:
        if _is_type_checking(node):
            statements += node.body
    where: dict[str, str] = {}
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            where.update({alias.name: node.module for alias in node.names if alias.asname == alias.name})
    return where


class Exports:
    """The public names of one package, read from its import block on first use.

    Args:
        package: the package's ``__name__``.
        publish_as: the module name public objects report as their ``__module__``, or None to leave them.
    """

    def __init__(self, package: str, *, publish_as: str | None = None) -> None:
        self._package = package
        self._publish_as = publish_as
        self._where: dict[str, str] | None = None

    def where(self) -> dict[str, str]:
        """Every public name and the module it comes from."""
        if self._where is None:
            self._where = reexports(self._source())
        return self._where

    def names(self) -> list[str]:
        """The package's ``__all__``: every public name, sorted the way ruff sorts ``__all__``."""
        return ruff_sorted(list(self.where()))

    def load(self, name: str) -> Any:
        """The value of ``name`` (for the package's ``__getattr__``), importing its module on first use.

        Raises:
            AttributeError: ``name`` is not a public name of the package.
        """
        if name == "__all__":
            return self.names()
        module = self.where().get(name)
        if module is None:
            raise AttributeError(f"module {self._package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        return value if self._publish_as is None else publish(value, self._publish_as)

    def _source(self) -> str:
        package: ModuleType = sys.modules[self._package]
        # Whatever loaded the package (an import hook such as pytest's assertion rewriter need not be an
        # InspectLoader, nor offer get_source): its own source file is the list of the public names.
        path = getattr(package, "__file__", None)
        if isinstance(path, str) and path.endswith(".py"):
            try:
                with open(path, encoding="utf-8") as file:
                    return file.read()
            except OSError:
                pass
        loader = getattr(package.__spec__, "loader", None)
        get_source = getattr(loader, "get_source", None)
        source = get_source(self._package) if callable(get_source) else None
        if source is None or not isinstance(source, str):
            # A frozen or sourceless install: the import block is the only list of the public names.
            raise ImportError(f"{self._package} needs its .py source to resolve its lazy public names")
        return source
