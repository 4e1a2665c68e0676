"""The public surface: complete, sorted, documented, and cheap to import."""

from __future__ import annotations

import inspect
import subprocess
import sys

import agentlife
import agentlife.constants
import agentlife.stores
import agentlife.testing


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


HEAVY = ("asyncpg", "qdrant_client", "anthropic", "aiohttp", "httpx", "opentelemetry", "croniter")


def test_import_agentlife_loads_only_the_core() -> None:
    code = (
        "import sys, agentlife\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
        "print(','.join(sorted(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_runtime_path_defers_heavy_clients() -> None:
    # Even the whole runtime (what `python -m agentlife run` imports before boot) stays off the heavy clients;
    # they load on the preload thread, the probe thread or the telemetry thread.
    code = (
        "import sys, agentlife._runtime._lifecycle, agentlife._cli, agentlife.testing._harness\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
        "print(','.join(sorted(heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
