"""The provider table: each row's adapter is what ``AGENTLIFE_LLM_PROVIDER`` gets, and names its calls."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentlife import ConfigError, LLMConfigurationError
from agentlife._config import llm_provider_from_env
from agentlife._llm._anthropic import AnthropicLLM
from agentlife._llm._default import UnconfiguredLLM, default_llm
from agentlife._llm._openai import OpenAICompatibleLLM
from agentlife._observe._telemetry import Telemetry
from agentlife._observe._telemetry_facade import TelemetryFacade
from agentlife._providers import DEFAULT_PROVIDER, PROVIDERS
from agentlife.testing import FakeOpenAIServer, ScriptedLLM
from stepctx import step_contexts

KEY = "sk-test-providers-0123456789"


@pytest.mark.parametrize("name", sorted(PROVIDERS))
def test_each_row_builds_its_adapter_which_names_itself_in_telemetry(name: str) -> None:
    row = PROVIDERS[name]
    env = {"AGENTLIFE_LLM_PROVIDER": name.upper()}  # the value is case-insensitive
    if row.key_variable:
        env[row.key_variable] = KEY
    client = default_llm(env)
    module, _, cls = row.adapter.partition(":")
    assert type(client) is getattr(importlib.import_module(module), cls)
    assert client.provider == name  # type: ignore[attr-defined]


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(n for n, row in PROVIDERS.items() if row.key_variable))
async def test_a_provider_without_its_key_fails_at_the_first_call_naming_the_variable(name: str) -> None:
    client = default_llm({"AGENTLIFE_LLM_PROVIDER": name})
    assert isinstance(client, UnconfiguredLLM)
    with pytest.raises(LLMConfigurationError, match=f"^{PROVIDERS[name].key_variable} is not set"):
        await client.complete(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1)


def test_an_unknown_provider_is_refused_naming_every_row() -> None:
    assert llm_provider_from_env({}) == DEFAULT_PROVIDER
    with pytest.raises(ConfigError) as refused:
        llm_provider_from_env({"AGENTLIFE_LLM_PROVIDER": "gemini"})
    assert all(name in str(refused.value) for name in PROVIDERS)


@pytest.mark.anyio
async def test_an_llm_calls_span_names_the_provider_of_its_client(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry("providers", {}, env={}, span_processors=[SimpleSpanProcessor(exporter)])
    facade = TelemetryFacade()
    facade._attach(telemetry)
    try:
        async with (
            FakeOpenAIServer({(0, 0): "hello", (0, 1): "again"}, api_key=KEY) as server,
            step_contexts(tmp_path) as make,
        ):
            ctx, _ = await make(OpenAICompatibleLLM(server.base_url, api_key=KEY))
            ctx._env.host.telemetry = facade  # type: ignore[misc]
            question = [{"role": "user", "content": "x"}]
            await ctx.llm.complete(model="gpt-test", max_tokens=10, messages=question)
            scripted, _ = await make(ScriptedLLM(["hi"]))
            scripted._env.host.telemetry = facade  # type: ignore[misc]
            await scripted.llm.complete(model="m", max_tokens=10, messages=question)
    finally:
        telemetry.shutdown(2.0)
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    assert [(s.attributes or {}).get("gen_ai.provider.name") for s in chats] == ["openai", "scripted"]


def test_the_default_anthropic_client_speaks_http_itself_and_nothing_preloads_the_sdk() -> None:
    client = default_llm({"ANTHROPIC_API_KEY": KEY})
    assert isinstance(client, AnthropicLLM) and not client.uses_sdk
    assert all("anthropic" not in row.preload for row in PROVIDERS.values())
