"""Agent code that misbehaves cannot stop the process from exiting, with the right code and a record."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from procs import REPO, agent_env


def _run(tmp_path: Path, target: str, timeout: float = 30, **extra: str) -> tuple[int, float, str]:
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="job-h",
        AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS="1",
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="1",
        **extra,
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agentlife", "run", target],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode, time.monotonic() - started, done.stdout + done.stderr


def _row(tmp_path: Path) -> tuple[str, list[dict[str, object]]]:
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    try:
        status, error = conn.execute("SELECT status, error FROM job WHERE id='job-h'").fetchone()
    finally:
        conn.close()
    return status, orjson.loads(error) if error else []


def _journal(tmp_path: Path) -> list[dict[str, object]]:
    (path,) = (tmp_path / "data" / "sessions" / "job-h").glob("*.jsonl")
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_a_stray_task_that_swallows_cancellation_cannot_hold_the_exit(tmp_path: Path) -> None:
    code, elapsed, out = _run(tmp_path, "agents.hostile_agent:StrayTaskAgent")
    assert code == 0, out
    assert elapsed < 10  # the cleanup budget (1 s) bounds it; without the armed exit it hangs for ever
    assert _row(tmp_path)[0] == "COMPLETED"


@pytest.mark.parametrize("kind", ["systemexit", "keyboardinterrupt", "generatorexit", "custom", "cancelled"])
@pytest.mark.parametrize("sync", ["0", "1"])
def test_a_tool_raising_a_base_exception_is_a_recorded_failure_with_cleanup(
    tmp_path: Path, kind: str, sync: str
) -> None:
    code, _, out = _run(
        tmp_path, "agents.hostile_agent:BaseExceptionToolAgent", HOSTILE_KIND=kind, HOSTILE_SYNC=sync
    )
    assert code == 1, out
    assert all(line.startswith("{") for line in out.splitlines() if line)  # JSON logs, no raw traceback
    status, errors = _row(tmp_path)
    assert status == "RUNNING"
    assert errors[-1]["error_class"] == "PermanentError"
    expected = {
        "systemexit": "SystemExit",
        "keyboardinterrupt": "KeyboardInterrupt",
        "generatorexit": "GeneratorExit",
        "custom": "_Custom",
        "cancelled": "CancelledError",
    }[kind]
    assert expected in str(errors[-1]["message"])
    events = _journal(tmp_path)
    failed = [e for e in events if e["type"] == "TOOL_FAILED"]
    assert failed and failed[-1]["error_class"] == "PermanentError"
    assert events[-1]["type"] == "SESSION_ENDED" and events[-1]["exit_code"] == 1  # cleanup ran
