"""The public surface: complete, sorted, documented, and cheap to import."""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import agentlife
import agentlife.constants
import agentlife.stores
import agentlife.testing
from agentlife._exports import reexports


def _ruff_sorted(names: list[str]) -> list[str]:
    # ruff's RUF022 "isort-style": SCREAMING_CASE, then CamelCase, then the rest; each alphabetically.
    def key(name: str) -> tuple[int, str]:
        if name.isupper() and len(name) > 1:
            return (0, name)
        if name[:1].isupper():
            return (1, name)
        return (2, name)

    return sorted(names, key=key)


def test_all_is_sorted_and_complete() -> None:
    for module in (agentlife, agentlife.stores, agentlife.testing, agentlife.constants):
        names = list(module.__all__)
        assert names == _ruff_sorted(names), module.__name__
        for name in names:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"


def test_public_names_point_to_the_public_module_and_have_docstrings() -> None:
    for name in agentlife.__all__:
        obj = getattr(agentlife, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ == "agentlife", name
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def test_exceptions_share_one_root_and_timeouts_are_timeouts() -> None:
    errors = [
        getattr(agentlife, n) for n in agentlife.__all__ if n.endswith(("Error", "Timeout", "Exhausted"))
    ]
    for error in errors:
        assert issubclass(error, agentlife.AgentlifeError), error
    assert issubclass(agentlife.LLMTimeout, TimeoutError) and issubclass(agentlife.ToolTimeout, TimeoutError)


def test_design_names_exist() -> None:
    for name in (
        "AgentProcess",
        "StepContext",
        "Done",
        "tool",
        "NOT_DONE",
        "State",
        "InvalidTransition",
        "LLMTimeout",
        "ScriptedLLM",
        "DeliveryGuard",
        "CircuitBreaker",
        "should_retry_after_crash",
        "derive_total_timeout",
        "Schedule",
        "PolicyUnavailable",
        "BackgroundOperationRestricted",
        "Embedder",
        "AgentlifeError",
        "AnthropicLLM",
        "OpenAICompatibleLLM",
    ):
        assert name in agentlife.__all__, name
    assert "HeartbeatMonitor" in agentlife.testing.__all__
    assert {"FakeAnthropicServer", "FakeOpenAIServer"} <= set(agentlife.testing.__all__)


def test_every_public_name_is_written_once_in_the_import_block() -> None:
    # __all__ and the lazy map are both read from the explicit re-exports (`from M import X as X`), so the
    # three lists that used to drift are one; a helper imported for the package's own use is not public.
    for module in (agentlife, agentlife.testing):
        where = module._EXPORTS.where()
        assert list(module.__all__) == _ruff_sorted(list(where)), module.__name__
        assert dir(module) == sorted(module.__all__)
        for name, source in where.items():
            assert getattr(module, name) is getattr(importlib.import_module(source), name), name
    assert not {"Any", "TYPE_CHECKING", "annotations", "Exports"} & set(agentlife.__all__)


def test_only_the_redundant_alias_marks_a_name_public() -> None:
    source = (
        "from typing import TYPE_CHECKING, Any\n"
        "from agentlife._agent import Done as Done\n"
        "from agentlife._agent import Job as OtherName\n"
        "if TYPE_CHECKING:\n"
        "    from agentlife._llm._anthropic import AnthropicLLM as AnthropicLLM\n"
        "    from agentlife._memory import Embedder\n"
        "if sys.version_info >= (3, 12):\n"
        "    from agentlife._state import State as State\n"
    )
    assert reexports(source) == {"Done": "agentlife._agent", "AnthropicLLM": "agentlife._llm._anthropic"}


def test_an_unknown_name_is_an_attribute_error_naming_the_package() -> None:
    with pytest.raises(AttributeError, match=r"module 'agentlife' has no attribute 'Nope'"):
        agentlife.Nope  # noqa: B018
    assert not hasattr(agentlife.testing, "Done")


def test_import_agentlife_loads_no_lazily_exported_module_and_reads_no_source() -> None:
    # Each lazy name's module stays unloaded until the name is used, and the import block is parsed only
    # when a lazy name or __all__ is first asked for, never by `import agentlife` itself.
    code = (
        "import sys, agentlife, agentlife.testing\n"
        "loaded = set(sys.modules)\n"
        "parsed = [m._EXPORTS._where is not None for m in (agentlife, agentlife.testing)]\n"
        "lazy = {m for module in (agentlife, agentlife.testing) for n, m in module._EXPORTS.where().items()\n"
        "        if n not in vars(module)}\n"
        "print(sorted(lazy & loaded), parsed, len(lazy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("[] [False, False] "), out.stdout
    assert int(out.stdout.split()[-1]) >= 20  # the lazy names of both packages were found


def test_lazy_names_resolve_when_an_import_hook_without_get_source_loaded_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A plain (non-editable) install under pytest: the package's loader is pytest's assertion rewriter,
    # which offers no get_source. The package's own file is still there to read.
    import types

    from agentlife._exports import Exports

    init = tmp_path / "hooked_pkg" / "__init__.py"
    init.parent.mkdir()
    block = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from json import dumps as dumps\n"
    init.write_text(block)
    package = types.ModuleType("hooked_pkg")
    package.__file__ = str(init)
    package.__spec__ = importlib.machinery.ModuleSpec("hooked_pkg", loader=object())  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "hooked_pkg", package)
    exports = Exports("hooked_pkg")
    import json

    assert exports.names() == ["dumps"] and exports.load("dumps") is json.dumps
