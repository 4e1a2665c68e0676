"""What a job process has imported when its first step starts: the boot path loads nothing it does not use.

Start-up is paid by every job (one pod each), so the clients of features a job does not use stay unloaded
until it uses them. Pinned by module names, not by timings: a new top-level import of a heavy package on
the boot path fails here on any machine.
"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from procs import agent_env, run_cli

#: Loaded only by the feature that needs them: none is used by a job on the embedded defaults.
NOT_AT_BOOT = (
    "aiohttp",  # the probe server is a plain thread server; aiohttp serves the test fakes
    "pydantic",  # tool schemas, at the first schema
    "qdrant_client",  # memory, with AGENTLIFE_QDRANT_URL or a local collection
    "asyncpg",  # postgresql:// stores
    "anthropic",  # the SDK transport, only for a client the user passes
    "openai",
    "mcp",  # an agent's MCP servers
    "agentlife._mcp",  # our side of them: loaded when an `MCPServer` is made
    "agentlife._runtime._mcp_tools",
    "hashlib",  # OpenSSL's start-up (about 2 ms): digests import it when first computed
    "agentlife._step._structured",  # structured replies, at the first ``output_type=``
    "croniter",  # schedules
    "h2",  # httpx's HTTP/2, never used
    "opentelemetry.exporter",  # only with OTEL_*_EXPORTER
    "agentlife.stores._postgres",
    "agentlife.stores._policy",  # crash records and the budget command
    "agentlife._memory",
    "agentlife._observe._heartbeat",  # the control plane's SSE heartbeat
    "agentlife._journal._show",
    "agentlife._manifest",
    "agentlife._schedule",
)
#: The command line's modules a ``run`` needs; the other commands' modules stay unloaded.
CLI_FOR_RUN = {"agentlife._cli", "agentlife._cli._common", "agentlife._cli._run"}


def _modules_at_first_step(tmp_path: Path, **extra: str) -> set[str]:
    out = tmp_path / "modules.txt"
    env = agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="imports", TEST_MODULES_FILE=str(out), **extra)
    done = run_cli("run", "agents.modules_agent:ModulesAgent", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return set(out.read_text(encoding="utf-8").split())


def _loaded(modules: set[str], name: str) -> list[str]:
    return sorted(m for m in modules if m == name or m.startswith(name + "."))


@pytest.mark.parametrize(
    "provider_env",
    [
        {},
        {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
        {"AGENTLIFE_LLM_PROVIDER": "openai", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
    ],
    ids=["no-key", "anthropic", "openai"],
)
def test_the_first_step_starts_without_the_clients_of_unused_features(
    tmp_path: Path, provider_env: dict[str, str]
) -> None:
    modules = _modules_at_first_step(tmp_path, **provider_env)
    assert "agentlife._runtime._lifecycle" in modules  # the dump did come from a running job
    loaded = {name: _loaded(modules, name) for name in NOT_AT_BOOT}
    assert not {name: found for name, found in loaded.items() if found}
    assert {m for m in modules if m.startswith("agentlife._cli")} == CLI_FOR_RUN


def test_the_list_names_modules_that_exist() -> None:
    # A renamed module would make its line above pass forever: each must still be found by name.
    for name in NOT_AT_BOOT:
        if name.startswith("agentlife."):
            assert importlib.util.find_spec(name) is not None, name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_without_an_exporter_the_telemetry_sdk_waits_until_the_first_step_is_done(tmp_path: Path) -> None:
    # The SDK's ~45 ms of imports would compete with the first model request; nothing is exported, so it
    # is built once the first step ends, and /metrics (scraped here while step 1 runs) still has it all.
    modules_file, metrics_file = tmp_path / "modules.txt", tmp_path / "metrics.txt"
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="deferred-telemetry",
        AGENTLIFE_HEALTH_PORT=str(_free_port()),
        TEST_MODULES_FILE=str(modules_file),
        TEST_METRICS_FILE=str(metrics_file),
    )
    done = run_cli("run", "agents.modules_agent:ScrapingModulesAgent", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    modules = set(modules_file.read_text(encoding="utf-8").split())
    assert not _loaded(modules, "opentelemetry.sdk")
    samples = _samples(metrics_file.read_text(encoding="utf-8"))
    assert samples[("agent_steps_completed_total", frozenset())] == 1  # step 0, replayed into the SDK
    assert samples[("agent_lifecycle_state", frozenset({("state", "EXECUTING")}))] == 1
    for phase in ("claim", "checkpoint", "journal_scan"):
        assert samples[("agent_hydration_duration_seconds_count", frozenset({("phase", phase)}))] == 1
