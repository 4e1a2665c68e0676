"""The provider table: each row's adapter is what ``AGENTLIFE_LLM_PROVIDER`` gets, and names its calls."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from agentlife._providers import PROVIDERS
from agentlife.testing import FakeAnthropicServer, FakeOpenAIServer
from procs import REPO, agent_env

KEY = "sk-test-providers-0123456789"


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(PROVIDERS))
async def test_a_process_on_a_providers_default_client_never_imports_a_model_sdk(
    name: str, tmp_path: Path
) -> None:
    server_class = FakeAnthropicServer if name == "anthropic" else FakeOpenAIServer
    async with server_class(default_turn="hi") as server:
        variables = {"anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
        key_variable, url_variable = variables.get(name, ("OPENAI_API_KEY", "OPENAI_BASE_URL"))
        env = agent_env(
            tmp_path / "data",
            AGENTLIFE_JOB_ID="modules-1",
            AGENTLIFE_LLM_PROVIDER=name,
            TEST_MARKER_DIR=str(tmp_path),
            **{key_variable: KEY, url_variable: server.base_url},
        )
        command = [sys.executable, "-m", "agentlife", "run", "agents.calls_agents:ModulesAgent"]
        with anyio.fail_after(60):
            proc = await anyio.run_process(command, env=env, cwd=REPO, check=False)
        assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()
        assert len(server.requests) == 1
    # A server on this machine is reached without httpx, and no SDK was loaded either.
    assert (tmp_path / "modules").read_text() == ""
