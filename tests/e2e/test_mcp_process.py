"""MCP tools under signals and exits: real agent processes (``python -m agentlife run``), real MCP servers.

Where only the agent's exit path matters, not its process, the agent runs in this process (`AgentHarness`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from agentlife import AgentProcess, Done, MCPServer, StepContext
from agentlife.testing import AgentHarness, DrainAt
from procs import REPO, agent_env, cli_in_process, run_cli, spawn, terminate

AGENT = "agents.mcp_agents:"
SERVER = str(REPO / "tests" / "mcp_test_server.py")


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
    wait_until(lambda: not alive(pid), timeout=10)  # signalled at cleanup; its exit may lag under load


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
    row = cli_in_process("job", "show", "notes-1", env=env)
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
    row = cli_in_process("job", "show", "lazy-1", env=env)
    assert row.returncode == 0 and "COMPLETED" in row.stdout, row.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Streamable HTTP server on the SDK, of its own (its URL, its state directory)."""
    state, port = tmp_path / "http-server", free_port()
    state.mkdir()
    proc = subprocess.Popen([sys.executable, SERVER, str(state), "--http", str(port)])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", state
    finally:
        proc.kill()
        proc.wait()


def test_a_destructive_http_call_the_server_finishes_after_a_sigkill_happens_once(
    tmp_path: Path, http_server: tuple[str, Path]
) -> None:
    # The agent is SIGKILLed while the server sleeps before the effect; the server (the SDK's, as most
    # are) finishes the orphaned call anyway, within the tool's timeout. The next attempt, in another
    # process, must not let verify look before that call is over: it waits out the call's deadline
    # (recorded start + timeout), then verify finds the effect, and the call is not made again.
    url, state = http_server
    (state / "create_sleep").write_text("2.5")
    env = agent_env(tmp_path / "data", MCP_STATE=str(state), MCP_URL=url, MCP_VERIFY="1", MCP_TIMEOUT="3")
    first = spawn(AGENT + "IssueAgent", {**env, "AGENTLIFE_ATTEMPT": "1"}, "--job-id", "orphan")
    try:
        wait_until(lambda: "create_issue" in calls(state))
    finally:
        terminate(first, signal.SIGKILL)
    killed = time.time()
    (state / "create_sleep").unlink()  # a second call would do its effect at once
    env["AGENTLIFE_PREVIOUS_EXIT_CODE"] = "137"
    second = spawn(AGENT + "IssueAgent", {**env, "AGENTLIFE_ATTEMPT": "2"}, "--job-id", "orphan")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, (out + err).decode()[-3000:]
    sent = json.loads((state / "calls.jsonl").read_text().splitlines()[0])["meta"]
    assert 0 < sent["agentlife/deadline"] - killed < 3  # the call's deadline went with it
    wait_until(lambda: time.time() > sent["agentlife/deadline"])  # the orphan is over by now
    assert [e["key"] for e in effects(state)] == ["orphan/0/0"]  # its effect, once
    assert calls(state).count("create_issue") == 1  # and no second call


# -- what a stdio server leaves in its process group ----------------------------------------------------


def group_members(group: int) -> list[int]:
    """The running processes (not zombies) of process group ``group``, read from ``/proc``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and fields[2] == str(group):
            found.append(int(entry.name))
    return found


@pytest.fixture
def grandchild(tmp_path: Path) -> Iterator[Path]:
    """The state directory of a ``--grandchild`` server; what a failing test leaves of it is SIGKILLed."""
    state = tmp_path / "server"
    yield state
    pids = server_pids(state) if (state / "pid").exists() else []
    for group in pids:
        for pid in group_members(group):
            os.kill(pid, signal.SIGKILL)


def test_what_a_stdio_server_left_in_its_group_is_gone_after_the_agent_exits(
    tmp_path: Path, grandchild: Path
) -> None:
    # The server exits as soon as its input ends, so the SDK never signals its group: the child it
    # started there would live on with parent 1.
    env = agent_env(tmp_path / "data", MCP_STATE=str(grandchild), MCP_GRANDCHILD="1")
    done = run_cli("run", AGENT + "IssueAgent", "--job-id", "leaves", env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (server,) = server_pids(grandchild)
    assert int((grandchild / "grandchild_pid").read_text()) != server
    wait_until(lambda: not group_members(server), timeout=5)


class GroupAgent(AgentProcess):
    """Calls ``lookup``, then ends as ``MCP_END`` says: done, crash, drained mid-call, the server quits."""

    agent_id = "mcp-group"
    mcp_servers: ClassVar[Any] = ()

    async def step(self, ctx: StepContext) -> Done | None:
        server, end = self.mcp_servers[0], os.environ["MCP_END"]
        await ctx.call_tool(server.tool("lookup"), key="k")
        if end == "crash":
            raise RuntimeError("the step crashed")
        if end == "drain":
            await ctx.call_tool(server.tool("slow"), seconds=60)
        if end == "quit":  # the server exits while the job goes on: what it left must go at once
            await ctx.call_tool(server.tool("quit"))
            (group,) = server_pids(Path(os.environ["MCP_STATE"]))
            with anyio.move_on_after(5):
                while group_members(group):
                    await anyio.sleep(0.02)
            return Done(result=group_members(group))
        return Done(result="done")


@pytest.mark.anyio
@pytest.mark.parametrize(("end", "code"), [("done", 0), ("crash", 1), ("drain", 143), ("quit", 0)])
async def test_no_exit_path_leaves_a_stdio_servers_group_behind(
    tmp_path: Path, grandchild: Path, end: str, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCP_END", end)
    monkeypatch.setenv("MCP_STATE", str(grandchild))
    agent = GroupAgent()
    agent.mcp_servers = (MCPServer.stdio(sys.executable, [SERVER, str(grandchild), "--grandchild"]),)
    drain = DrainAt.during_tool("slow") if end == "drain" else None
    run = await AgentHarness(tmp_path / "data").run(agent, job_id=f"group-{end}", drain=drain)
    assert run.exit_code == code, run.log_messages()
    if end == "quit":
        assert run.job is not None and run.job.result == []  # gone while the job still ran
    (server,) = server_pids(grandchild)
    wait_until(lambda: not group_members(server), timeout=5)
