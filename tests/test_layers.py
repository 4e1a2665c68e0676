"""The layer rule, read from the folders: no module imports one above its layer, no import cycles.

A module's layer is the folder it lives in, lowest first: the vocabulary (the modules at the package's
root, the names everyone speaks) <- storage (``stores/``, ``_journal/``) <- clients of models and tool
servers (``_llm/``, ``_mcp/``) <- observability (``_observe/``) <- the step API (``_step/``) <- the
engine (``_runtime/``) <- what an operator sees of a job and may do to it (``_jobs/``) <- an
application's client of the store (``_client/``) <- tools
(``_cli/``, ``_console/``, ``testing/`` and ``__main__``), which stand side by side: none imports
another's modules but for the edges in `BETWEEN_TOOLS`. No module imports a private name (``_x``) from
another package: a private module's public names are how the code is cut, its ``_`` names are its own.
Imports under ``if TYPE_CHECKING:`` are free of the layer rule (not of that one). A function-level import
of an agentlife module is allowed only where it keeps a module off the boot path (each listed in
`DEFERRED`, with its reason), plus the documented edges from the agent API up to its defaults and to the
command line (`UPWARD`).
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

#: The folders of each layer, lowest first ("" is the package's root).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocabulary", ("",)),
    ("storage", ("stores", "_journal", "_output")),
    ("clients", ("_llm", "_mcp")),
    ("observability", ("_observe",)),
    ("step API", ("_step",)),
    ("engine", ("_runtime",)),
    ("operations", ("_jobs",)),
    ("client", ("_client",)),
    ("tools", ("_cli", "_console", "testing", "__main__")),
)
LAYER_NAMES = tuple(name for name, _ in LAYERS)

#: Lazy imports that keep a module (and what it loads) off the boot path or out of ``import agentlife``.
DEFERRED: dict[tuple[str, str], str] = {
    ("agentlife", "*"): "the façade: public names load on first access",
    ("agentlife._agent", "agentlife._llm._default"): "make_llm()'s default, resolved when called",
    ("agentlife._agent", "agentlife._memory"): "make_embedder()'s default, resolved when called",
    ("agentlife._agent", "agentlife._cli"): "AgentProcess.main() is the command line's run",
    (
        "agentlife._observe._telemetry_facade",
        "agentlife._observe._telemetry",
    ): "built after READY, off the boot path",
    ("agentlife.stores", "agentlife.stores._postgres"): "only for postgresql:// URLs",
    ("agentlife._console._store", "agentlife.stores._postgres"): "asyncpg only for postgresql:// URLs",
    ("agentlife._client._client", "agentlife.stores._postgres"): "asyncpg only for postgresql:// URLs",
    ("agentlife.stores._jobs", "agentlife.stores._policy"): "_policy reads JobStatus from the stores package",
    ("agentlife._runtime._services", "agentlife._observe._heartbeat"): "15 ms, only with a control plane URL",
    (
        "agentlife._runtime._process",
        "agentlife._observe._probes",
    ): "7 ms, imported as the probe thread starts",
    ("agentlife._runtime._services", "agentlife._memory"): "only when a memory store exists",
    ("agentlife._runtime._finish", "agentlife.stores._policy"): "6 ms, only for a crash record",
    ("agentlife._step._stepllm", "agentlife._step._structured"): "only for structured replies, not at boot",
    (
        "agentlife._runtime._services",
        "agentlife._runtime._mcp_tools",
    ): "5 ms, only for an agent with MCP servers",
    ("agentlife._cli._run", "agentlife._runtime._lifecycle"): "the engine loads for run, not for --help",
    (
        "agentlife._cli._demo",
        "agentlife._cli._demo_run",
    ): "the demo's engine loads for demo, not for --help or job",
    ("agentlife._cli._worker", "agentlife._runtime._worker"): "the engine loads for worker, not for --help",
    ("agentlife._cli._manifest", "agentlife._schedule"): "only with --schedule",
    ("agentlife._cli._console", "agentlife._console._server"): "aiohttp and the pages load for console only",
    ("agentlife._cli._manifest", "agentlife.stores._policy"): "only with --from-journals",
    ("agentlife._cli._common", "agentlife._runtime._signals"): "installed first thing; anyio loads with it",
    (
        "agentlife.testing._plugin",
        "agentlife.testing._harness",
    ): "pytest loads every plugin: it must cost nothing",
}

#: The tools stand side by side on the layers below (a job's view and operations live in ``_jobs/``, which
#: both the command line and the console import): none imports another's modules, except these edges.
TOOLS = ("_cli", "_console", "testing", "__main__")
BETWEEN_TOOLS = {
    ("agentlife.__main__", "agentlife._cli"): "python -m agentlife is the command line",
    ("agentlife._cli._console", "agentlife._console._server"): "the console command starts its server",
}

#: Imports that go up a layer on purpose.
UPWARD = {
    ("agentlife", "*"),
    ("agentlife._agent", "agentlife._llm._default"),
    ("agentlife._agent", "agentlife._memory"),
    ("agentlife._agent", "agentlife._cli"),
}


def layer(module: str) -> int:
    """The layer of ``module``, from the folder it lives in (a module at the root is vocabulary)."""
    parts = module.split(".")
    place = parts[1] if len(parts) > 1 else "__init__"
    for index, (_, folders) in enumerate(LAYERS):
        if place in folders:
            return index
    if (SRC / "agentlife" / f"{place}.py").exists():
        return 0
    raise AssertionError(f"{module} lives in a folder no layer names: add it to LAYERS")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(tree: ast.AST, module: str) -> list[tuple[str, bool]]:
    """(imported agentlife module, inside a function) for every import outside TYPE_CHECKING blocks."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("agentlife"):
                found.append((_resolve(node.module, [a.name for a in node.names]), in_function))
        elif isinstance(node, ast.Import):
            found.extend((a.name, in_function) for a in node.names if a.name.startswith("agentlife"))
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return [(target, lazy) for target, lazy in found if target != module]


def _resolve(module: str, names: list[str]) -> str:
    # `from agentlife._runtime import _base` imports the submodule, not the package.
    for name in names:
        if (SRC / module.replace(".", "/") / f"{name}.py").exists():
            return f"{module}.{name}"
    return module


@functools.cache
def _trees() -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed once for all the tests here."""
    return {
        _module_name(path): ast.parse(path.read_text()) for path in sorted((SRC / "agentlife").rglob("*.py"))
    }


def _graph() -> dict[str, list[tuple[str, bool]]]:
    return {module: _imports(tree, module) for module, tree in _trees().items()}


def _allowed(source: str, target: str, table: dict[tuple[str, str], str] | set[tuple[str, str]]) -> bool:
    return (source, target) in table or (source, "*") in table


def test_no_import_goes_up_a_layer() -> None:
    bad = [
        f"{source} ({LAYER_NAMES[layer(source)]}) imports {target} ({LAYER_NAMES[layer(target)]})"
        for source, imports in _graph().items()
        for target, _ in imports
        if layer(target) > layer(source) and not _allowed(source, target, UPWARD)
    ]
    assert not bad, "\n".join(bad)


def _place(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_tools_stand_side_by_side_none_importing_another() -> None:
    bad = [
        f"{source} imports {target}"
        for source, imports in _graph().items()
        for target, _ in imports
        if _place(source) in TOOLS
        and _place(target) in TOOLS
        and _place(source) != _place(target)
        and (source, target) not in BETWEEN_TOOLS
    ]
    assert not bad, "\n".join(bad)


def _package_of(module: str) -> str:
    """The package a module belongs to (a package is its own)."""
    path = SRC / module.replace(".", "/")
    return module if (path / "__init__.py").exists() else module.rpartition(".")[0]


def _is_module(package: str, name: str) -> bool:
    path = SRC / package.replace(".", "/") / name
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def private_names_from_other_packages(tree: ast.AST, module: str) -> list[str]:
    """``target.name`` for each private name (``_x``, not a module) ``module`` imports from another package.

    Private modules are how the code is cut, so importing one's public names is fine; a name that starts
    with ``_`` is its module's own business, and a package that needs it from outside should give it a
    public name (or the helper should move to a layer both stand on). Imports under ``TYPE_CHECKING``
    count too: they couple the same way.
    """
    own = _package_of(module)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            continue
        if not node.module.startswith("agentlife") or _package_of(node.module) == own:
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not name.startswith("__") and not _is_module(node.module, name):
                found.append(f"{node.module}.{name}")
    return found


def test_no_module_imports_a_private_name_from_another_package() -> None:
    bad = [
        f"{module} imports {name}"
        for module, tree in _trees().items()
        for name in private_names_from_other_packages(tree, module)
    ]
    assert not bad, "\n".join(bad)


def test_the_private_name_rule_reads_packages_not_modules() -> None:
    source = (
        "from agentlife._cli._job import _history_line, open_store\n"  # a private name from _cli: refused
        "from agentlife._console._data import _alive\n"  # a private name of its own package: fine
        "from agentlife._runtime import _lifecycle\n"  # a private module: fine
        "from agentlife._version import __version__\n"  # a dunder is not private
        "if TYPE_CHECKING:\n"
        "    from agentlife.stores._base import _Row\n"  # typing-only, still coupling: refused
    )
    found = private_names_from_other_packages(ast.parse(source), "agentlife._console._server")
    assert found == ["agentlife._cli._job._history_line", "agentlife.stores._base._Row"]


def test_no_function_level_import_of_agentlife_except_the_deferred_ones() -> None:
    bad = [
        f"{source} imports {target} inside a function"
        for source, imports in _graph().items()
        for target, lazy in imports
        if lazy and not _allowed(source, target, DEFERRED)
    ]
    assert not bad, "\n".join(bad)


def test_every_deferred_import_is_still_there() -> None:
    lazy = {
        (source, target) for source, imports in _graph().items() for target, is_lazy in imports if is_lazy
    }
    stale = [edge for edge in DEFERRED if edge[1] != "*" and edge not in lazy]
    assert not stale, f"listed as deferred but no longer lazy (remove them): {stale}"


def test_no_import_cycle_even_counting_lazy_imports() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for source, imports in _graph().items():
        if source == "agentlife":  # the façade: every public name lives below it
            continue
        for target, _ in imports:
            # The documented upward edges (the agent API's defaults and AgentProcess.main) are resolved
            # when called: they belong to the façade, like ``agentlife``'s lazy names.
            if target != "agentlife" and (source, target) not in UPWARD:
                graph[source].add(target)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_is_over_700_lines() -> None:
    long = {
        str(path.relative_to(SRC)): n
        for path in (SRC / "agentlife").rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 700
    }
    assert not long, long


def test_the_lifecycle_reads_top_to_bottom_in_under_300_lines() -> None:
    assert len((SRC / "agentlife" / "_runtime" / "_lifecycle.py").read_text().splitlines()) < 300


def test_every_folder_belongs_to_a_layer() -> None:
    named = {folder for _, folders in LAYERS for folder in folders}
    folders = {p.name for p in (SRC / "agentlife").iterdir() if (p / "__init__.py").exists()}
    assert folders <= named, f"folders without a layer: {sorted(folders - named)}"
    assert not (named - folders - {"", "__main__"}), f"layers name missing folders: {named - folders}"
