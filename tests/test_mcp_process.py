"""MCP tools under signals, with real agent processes (``python -m agentlife run``) and real MCP servers."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from procs import agent_env, spawn, terminate

AGENT = "agents.mcp_agents:"


def effects(state: Path) -> list[dict[str, object]]:
    path = state / "effects.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_until(predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.02)


def server_pids(state: Path) -> list[int]:
    return [int(line.split()[0]) for line in (state / "pid").read_text().splitlines()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("with_verify", [True, False])
def test_sigkill_during_a_destructive_mcp_call(tmp_path: Path, with_verify: bool) -> None:
    state = tmp_path / "server"
    state.mkdir()
    (state / "create_delay").write_text("60")  # the effect is done, the answer never comes
    env = agent_env(tmp_path / "data", MCP_STATE=str(state), MCP_VERIFY="1" if with_verify else "0")
    proc = spawn(AGENT + "IssueAgent", {**env, "AGENTLIFE_ATTEMPT": "1"}, "--job-id", "j1")
    try:
        wait_until(lambda: len(effects(state)) == 1)
    finally:
        terminate(proc, signal.SIGKILL)
    (state / "create_delay").unlink()
    env["AGENTLIFE_PREVIOUS_EXIT_CODE"] = "137"
    second = spawn(AGENT + "IssueAgent", {**env, "AGENTLIFE_ATTEMPT": "2"}, "--job-id", "j1")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, (out + err).decode()[-3000:]
    keys = [e["key"] for e in effects(state)]
    if with_verify:
        assert keys == ["j1/0/0"]  # verify found it by its idempotency key: the effect once
    else:
        assert keys == ["j1/0/0", "j1/0/0"]  # no verify: the documented at-least-once


def test_sigterm_during_a_slow_mcp_call_drains_in_budget_and_stops_the_server(tmp_path: Path) -> None:
    state = tmp_path / "server"
    env = agent_env(
        tmp_path / "data",
        MCP_STATE=str(state),
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="1",
        AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS="8",
    )
    proc = spawn(AGENT + "SlowAgent", env, "--job-id", "slow")
    wait_until(lambda: (state / "calls.jsonl").exists())
    code, seconds, output = terminate(proc)
    assert code == 143, output[-3000:]
    assert seconds < 1 + 8 + 2  # the step deadline plus the cleanup budget, with a margin
    (pid,) = server_pids(state)
    wait_until(lambda: not alive(pid), timeout=2)
