"""Secrets a real process meets before and around its lifecycle never reach its output: a database
password with reserved characters, a token quoted before the lifecycle starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlife._redact import MASK
from procs import agent_env, run_cli

TOKEN = "cp-token-5f2a9c7e"


# -- secret masking ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_database_password_with_reserved_characters_never_reaches_output(
    tmp_path: Path, command: str
) -> None:
    url = "postgresql://agent:pa/ss#w?rd@127.0.0.1:1/jobs"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url)
    args = ["run", "agents.drain_agent:DrainAgent", "--job-id", "j"] if command == "run" else ["check"]
    result = run_cli(*args, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "AGENTLIFE_DATABASE_URL" in result.stderr
    assert "ss#w" not in result.stderr + result.stdout and "pa/ss" not in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("where", ["import", "init"])
def test_a_token_quoted_before_the_lifecycle_starts_is_masked(tmp_path: Path, where: str) -> None:
    extra = {"TEST_LEAK_AT_IMPORT": "1"} if where == "import" else {}
    env = agent_env(tmp_path / "data", AGENTLIFE_CONTROL_PLANE_TOKEN=TOKEN, **extra)
    target = "agents.hardening_agents:" + ("CyclicResultAgent" if where == "import" else "LeakyInitAgent")
    result = run_cli("run", target, "--job-id", "j", env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert TOKEN not in result.stderr + result.stdout
    assert MASK in result.stderr
    assert not (tmp_path / "data").exists()
