"""MCP tools under signals, with real agent processes (``python -m agentlife run``) and real MCP servers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from procs import REPO, agent_env, run_cli, spawn, terminate

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
    """Running: not gone and not a zombie (an orphan's zombie waits for init, which may be slow to reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


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


def test_the_notes_example_runs_as_documented_and_adds_its_note_once(tmp_path: Path) -> None:
    data = tmp_path / "notes"
    env = agent_env(data)
    # As docs/mcp-tools.md says: from examples/, ``python -m agentlife run mcp_notes_agent:NotesAgent``.
    done = subprocess.run(
        [sys.executable, "-m", "agentlife", "run", "mcp_notes_agent:NotesAgent", "--job-id", "notes-1"],
        cwd=REPO / "examples",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    notes = [json.loads(line) for line in (data / "notes.jsonl").read_text().splitlines()]
    assert notes == [{"key": "notes-1/1/1", "text": "ship the MCP example"}]  # once, keyed by invocation id
    row = run_cli("job", "show", "notes-1", env=env)
    assert row.returncode == 0 and "COMPLETED" in row.stdout and '"Noted."' in row.stdout, row.stdout
    (session,) = (data / "sessions" / "notes-1").glob("session_0001_*.jsonl")
    shown = run_cli("journal", "show", str(session), env=env)
    assert shown.returncode == 0, shown.stderr
    assert "MCP_TOOLS server=notes transport=stdio" in shown.stdout
    assert "tool call 1 list_notes [notes-1/0/1]: completed" in shown.stdout
    assert "tool call 1 add_note [notes-1/1/1]: completed" in shown.stdout


@pytest.fixture
def stubborn(tmp_path: Path) -> Iterator[Path]:
    """The state directory of a ``--stubborn`` server; whatever of it a failing test leaves is SIGKILLed."""
    state = tmp_path / "server"
    yield state
    pids = server_pids(state) if (state / "pid").exists() else []
    if (state / "child_pid").exists():
        pids.append(int((state / "child_pid").read_text()))
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def calls(state: Path) -> list[str]:
    path = state / "calls.jsonl"
    return [json.loads(line)["tool"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_server_that_ignores_sigterm_and_end_of_input_is_gone_after_a_hard_exit(
    tmp_path: Path, stubborn: Path
) -> None:
    # The step blocks the event loop, so the drain can only end by the hard exit: the SDK's stop of the
    # server never runs. The server and the child it started in its group ignore SIGTERM and never exit on
    # their own; the hard exit kills their process group before os._exit.
    env = agent_env(
        tmp_path / "data",
        MCP_STATE=str(stubborn),
        MCP_BLOCK="1",
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="0.5",
        AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS="0.5",
        AGENTLIFE_DRAIN_SIGKILL_BUFFER_SECONDS="0.5",
    )
    proc = spawn(AGENT + "StubbornServerAgent", env, "--job-id", "stubborn")
    wait_until(lambda: (stubborn / "blocking").exists())
    code, _, output = terminate(proc)
    assert code == 143 and "exceeded by code that ignores cancellation" in output, output[-3000:]
    (server,) = server_pids(stubborn)
    child = int((stubborn / "child_pid").read_text())
    wait_until(lambda: not alive(server) and not alive(child), timeout=5)


def test_a_server_that_ignores_end_of_input_dies_with_a_sigkilled_agent(
    tmp_path: Path, stubborn: Path
) -> None:
    # Nothing in the agent runs after SIGKILL: the kernel's parent-death signal, asked for by the launcher
    # the server was started through, kills the server. (What the server started itself is out of reach:
    # the fixture kills the child.)
    env = agent_env(tmp_path / "data", MCP_STATE=str(stubborn))
    proc = spawn(AGENT + "StubbornServerAgent", env, "--job-id", "stubborn")
    wait_until(lambda: calls(stubborn) == ["lookup", "slow"])
    terminate(proc, signal.SIGKILL)
    (server,) = server_pids(stubborn)
    wait_until(lambda: not alive(server), timeout=5)


def test_the_hard_exit_kills_a_group_only_while_its_leader_is_still_a_child_leading_it() -> None:
    # A registered id is a process group's only while its leader is this process's child leading its own
    # group; a pid that is not (one reused by another process) must not take its group down with it.
    from agentlife import _children

    leader = subprocess.Popen(["sleep", "60"], start_new_session=True)
    follower = subprocess.Popen(["sleep", "60"])  # this process's group, not a group of its own
    try:
        for pid in (leader.pid, follower.pid):
            _children.register_group(pid)
        _children.kill_groups()
        assert leader.wait(timeout=5) == -signal.SIGKILL
        assert follower.poll() is None
    finally:
        for proc in (leader, follower):
            _children.forget_group(proc.pid)
            proc.kill()
            proc.wait()


def test_a_server_made_by_a_property_on_first_access_is_started(tmp_path: Path) -> None:
    # The agent's module never imports MCPServer, so no MCP code is loaded when the runtime looks for its
    # servers: skipping the MCP step because "nothing made a server yet" would fail the step's calls.
    state = tmp_path / "server"
    state.mkdir()
    env = agent_env(tmp_path / "data", MCP_STATE=str(state))
    done = run_cli("run", "agents.lazy_mcp_agent:LazyServerAgent", "--job-id", "lazy-1", env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert [e["title"] for e in effects(state)] == ["disk full"]
    row = run_cli("job", "show", "lazy-1", env=env)
    assert row.returncode == 0 and "COMPLETED" in row.stdout, row.stdout
