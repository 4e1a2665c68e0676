"""Progress-aware calls *through the runtime*: ``ctx.llm``, ``ctx.call_tool``, the drain and the job row.

The pieces (the stream guard, `AnthropicLLM`, `ScriptedTurn`, `retry_call`, `FakeAnthropicServer`) have
their own unit tests; here they run together. LLM calls go through the real ``anthropic`` SDK to a
`FakeAnthropicServer` on 127.0.0.1. Most tests use the in-process `AgentHarness` (time scaled by 0.01: the
45 s step deadline lasts 0.45 s); the ones whose point is the real process (exit codes, signals, a blocked
event loop, ``ANTHROPIC_BASE_URL`` read from the environment) run ``python -m agentlife run``.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from agentlife import (
    AgentProcess,
    Done,
    StepContext,
    Usage,
    tool,
)
from agentlife._llm._scripted import ScriptedTurn
from agentlife.testing import AgentHarness, DrainAt
from agentlife.testing._anthropic_server import FakeAnthropicServer
from procs import REPO, agent_env, json_lines, spawn, terminate, wait_for

pytestmark = pytest.mark.anyio

KEY = "sk-ant-api03-calls-e2e-secret-0123456789"


@pytest.fixture(scope="module")
def _anthropic_imported() -> None:
    """Import the SDK once, outside any measured step (it takes ~2 s of CPU the first time)."""
    import anthropic  # noqa: F401


@pytest.fixture
async def server(_anthropic_imported: None) -> AsyncIterator[FakeAnthropicServer]:
    async with FakeAnthropicServer(api_key=KEY) as fake:
        yield fake


def _harness(tmp_path: Path, **env: str) -> AgentHarness:
    return AgentHarness(tmp_path / "agentlife", env=env)


def _events(run_journal: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in run_journal if e["type"] == kind]


def _job_row(db: Path, job_id: str) -> dict[str, Any]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        row = conn.execute("SELECT * FROM job WHERE id = ?", (job_id,)).fetchone()
    finally:
        conn.close()
    assert row is not None
    json_columns = ("payload", "tokens_consumed", "token_budget", "error", "result")
    record = dict(zip(row.keys(), tuple(row), strict=True))
    return {k: (orjson.loads(v) if k in json_columns and v else v) for k, v in record.items()}


# --- 1. token budget -------------------------------------------------------------------------------------


async def test_cost_budget_fails_a_real_process_before_the_next_call(
    tmp_path: Path, server: FakeAnthropicServer
) -> None:
    # Each call costs 1000 x $3/MTok + 200 x $15/MTok = $0.006; the budget is $0.01. The default make_llm()
    # builds AnthropicLLM from ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL.
    usage = Usage(input_tokens=1000, output_tokens=200)
    server.enqueue(*(ScriptedTurn.text(f"reply {i}", usage=usage) for i in range(3)))
    data = tmp_path / "data"
    env = agent_env(
        data,
        AGENTLIFE_JOB_ID="job-budget",
        AGENTLIFE_BUDGET_MAX_COST_USD="0.01",
        ANTHROPIC_API_KEY=KEY,
        ANTHROPIC_BASE_URL=server.base_url,
        TEST_STEPS="5",
    )
    command = [sys.executable, "-m", "agentlife", "run", "agents.calls_agents:LLMStepsAgent"]
    with anyio.fail_after(60):
        proc = await anyio.run_process(command, env=env, cwd=REPO, check=False)
    output = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 0, output

    # After two calls ($0.012 >= $0.01) the third was refused before any request: the server saw two.
    assert len(server.requests) == 2 and server.pending == 1
    message = "token budget exhausted ($0.0120 / $0.0100 max)"
    row = _job_row(data / "agentlife.db", "job-budget")
    assert row["status"] == "FAILED"
    assert row["token_budget"] == {"max_input_tokens": 500000, "max_cost_usd": 0.01}
    assert row["tokens_consumed"] == {"input": 2000, "output": 400, "cost_usd": pytest.approx(0.012)}
    assert row["result"] == {"reason": message}
    assert row["error"][-1]["error_class"] == "BudgetExhausted"
    assert row["error"][-1]["message"] == message
    assert row["error"][-1]["exit_code"] == 0
    checkpoint = orjson.loads(row["checkpoint"])
    assert checkpoint["state"]["replies"] == ["reply 0", "reply 1"]  # steps 0 and 1 completed
    assert any(line.get("msg") == message for line in json_lines(output))
    assert KEY not in output and KEY not in str(row)


# --- 5. tools that ignore cancellation cannot hold a real process ----------------------------------------


@pytest.mark.parametrize("kind", ["sync", "loop"])
def test_a_tool_ignoring_cancellation_cannot_hold_the_process_past_the_drain_budget(
    tmp_path: Path, kind: str
) -> None:
    # Step deadline 0.5 s + cleanup 0.5 s + hard-exit margin (half the 0.5 s SIGKILL buffer) = 1.25 s. The
    # tool sleeps 60 s, either on its worker thread (sync) or on the event loop itself (loop).
    markers = tmp_path / "markers"
    markers.mkdir()
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="job-stubborn",
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="0.5",
        AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS="0.5",
        AGENTLIFE_DRAIN_SIGKILL_BUFFER_SECONDS="0.5",
        TEST_MARKER_DIR=str(markers),
        TEST_TOOL=kind,
        TEST_TOOL_SECONDS="60",
    )
    proc = spawn("agents.calls_agents:StubbornToolAgent", env)
    try:
        wait_for(markers / "tool-started")
        code, elapsed, output = terminate(proc, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 143, output
    assert 0.4 <= elapsed < 5.0, elapsed  # about 0.5 s (sync) or 1.25 s (loop); never the tool's 60 s
    assert not (markers / "tool-finished").exists()
    row = _job_row(tmp_path / "data" / "agentlife.db", "job-stubborn")
    assert row["status"] == "RUNNING" and row["checkpoint"] is None  # nothing saved for the partial step
    if kind == "sync":
        # The worker thread is abandoned at the deadline; cleanup runs normally on the free loop.
        assert any("cancelled at the drain deadline" in str(line.get("msg")) for line in json_lines(output))
    else:
        # The loop never ran again: the signal handler armed the hard exit off the loop.
        assert "exceeded by code that ignores cancellation: exiting 143 now" in output


def test_a_sigterm_delivered_to_another_thread_still_ends_a_blocked_loop(tmp_path: Path) -> None:
    # The kernel may hand a process signal to any thread. With the main thread asleep inside a blocking
    # tool, a Python-level handler would never run; the wakeup fd is written by whichever thread takes it.
    markers = tmp_path / "markers"
    markers.mkdir()
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="job-offthread",
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="0.5",
        AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS="0.5",
        AGENTLIFE_DRAIN_SIGKILL_BUFFER_SECONDS="0.5",
        TEST_MARKER_DIR=str(markers),
        TEST_TOOL="loop",
        TEST_TOOL_SECONDS="60",
        TEST_SIGTERM_FROM_THREAD="1",
    )
    proc = spawn("agents.calls_agents:StubbornToolAgent", env)
    try:
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, (out + err).decode(errors="replace")[-2000:]
    assert not (markers / "tool-finished").exists()


# --- 6. a subprocess started by a tool dies with it ------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("how", ["run_process", "open_process"])
async def test_drain_deadline_kills_a_tool_subprocess(tmp_path: Path, how: str) -> None:
    pid_file = tmp_path / "child.pid"
    command = ["sh", "-c", f'echo $$ > "{pid_file}"; exec sleep 60']

    @tool(name="spawn_child", side_effects=True)
    async def spawn_child() -> str:
        if how == "run_process":
            await anyio.run_process(command)
        else:
            async with await anyio.open_process(command) as process:
                await process.wait()
        return "child finished"

    class Spawner(AgentProcess):
        agent_id = "spawner"

        async def step(self, ctx: StepContext) -> Done | None:
            return Done(result=await ctx.call_tool(spawn_child))

    run = await _harness(tmp_path).run(Spawner(), drain=DrainAt.during_tool("spawn_child"))
    assert run.exit_code == 143
    pid = int(pid_file.read_text())
    assert not _pid_alive(pid)  # killed and reaped when the deadline cancelled the tool
    [failed] = _events(run.journal, "TOOL_STARTED")
    assert failed["tool"] == "spawn_child" and "TOOL_COMPLETED" not in run.journal_types()


# --- 7. approvals and policy -----------------------------------------------------------------------------

EFFECTS: list[str] = []
PLANS: list[str] = []


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()
    PLANS.clear()
