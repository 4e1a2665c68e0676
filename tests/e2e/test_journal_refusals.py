"""What the journal refuses, and what it left pending, across real ``python -m agentlife run`` processes.

- A side-effecting tool whose result the journal cannot hold exactly (a cycle, nesting past the limit, a
  lone surrogate) did its effect: the call is recorded as completed with the refusal, so a resume or a
  rerun gets the same error back and the effect never runs twice.
- A read-only call that started and never finished has nothing recorded: the next attempt runs it with
  its own arguments. A pending side-effecting call with other arguments is still a replay mismatch.

- Text that is only shown (an exception's message) with a lone surrogate is written with its escape:
  the crash record, the log line, the journal and the model's ``tool_result`` stay JSON.

The agents are in ``tests/agents/journal_agents.py``; every effect is a line in a marker file.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentlife._journal._writer import list_sessions
from procs import agent_env, json_lines, run_cli, spawn, wait_for

REFUSED = "agents.journal_agents:RefusedResultAgent"
PENDING = "agents.journal_agents:PendingCallAgent"
KINDS = {"cycle": "a cycle", "deep": "nested deeper than 128 levels", "surrogate": "a lone surrogate"}


def _env(tmp_path: Path, attempt: int, **extra: str) -> dict[str, str]:
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="job-j",
        AGENTLIFE_ATTEMPT=str(attempt),
        TEST_MARKER_DIR=str(markers),
        **extra,
    )


def _lines(tmp_path: Path, name: str) -> list[str]:
    path = tmp_path / "markers" / name
    return path.read_text().splitlines() if path.exists() else []


def _row(tmp_path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    try:
        status, error, result = conn.execute(
            "SELECT status, error, result FROM job WHERE id='job-j'"
        ).fetchone()
    finally:
        conn.close()
    return {
        "status": status,
        "error": orjson.loads(error) if error else [],
        "result": orjson.loads(result) if result else None,
    }


def _journal(tmp_path: Path) -> list[dict[str, Any]]:
    events = []
    for path in list_sessions(tmp_path / "data" / "sessions" / "job-j"):
        events += [orjson.loads(raw) for raw in path.read_bytes().splitlines() if raw.strip()]
    return events


def _kill_when(tmp_path: Path, proc: subprocess.Popen[bytes], needle: bytes) -> None:
    """SIGKILL ``proc`` once it hangs and ``needle`` reached its journal file (buffered lines take ≤ 1 s)."""
    try:
        wait_for(tmp_path / "markers" / "hanging")
        deadline = time.monotonic() + 10
        while not any(needle in p.read_bytes() for p in (tmp_path / "data" / "sessions").glob("*/*.jsonl")):
            assert time.monotonic() < deadline, f"{needle!r} never reached the journal"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)


# -- a refused result of a side effect ------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_refused_result_survives_sigkill_as_the_same_error_and_the_effect_runs_once(
    tmp_path: Path, kind: str
) -> None:
    env = _env(tmp_path, 1, TEST_KIND=kind, TEST_CATCH="1", TEST_HANG_ATTEMPT="1")
    _kill_when(tmp_path, spawn(REFUSED, env), b'"error_class":"UnreplayableValue"')
    (first_error,) = _lines(tmp_path, "errors")
    assert KINDS[kind] in first_error

    done = run_cli("run", REFUSED, env=_env(tmp_path, 2, TEST_KIND=kind, TEST_CATCH="1"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert len(_lines(tmp_path, "effects")) == 1  # one effect, in attempt 1
    second_error = _lines(tmp_path, "errors")[1]
    assert second_error == first_error  # the resumed step got the recorded error, word for word
    row = _row(tmp_path)
    assert row["status"] == "COMPLETED" and repr(row["result"]["error"]) == first_error
    completed = [e for e in _journal(tmp_path) if e["type"] == "TOOL_COMPLETED" and not e.get("carried")]
    assert len(completed) == 1 and completed[0]["result"] is None  # recorded once, by attempt 1


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_rerun_after_the_refusal_crashed_the_step_fails_the_same_way_without_the_effect(
    tmp_path: Path, kind: str
) -> None:
    outputs = []
    for attempt in (1, 2, 3):
        done = run_cli("run", REFUSED, env=_env(tmp_path, attempt, TEST_KIND=kind))
        assert done.returncode == 1, done.stdout[-2000:] + done.stderr
        assert "Traceback" not in done.stderr and "internal error" not in done.stdout + done.stderr
        outputs.append(done.stdout)
    assert len(_lines(tmp_path, "effects")) == 1
    crashes = _row(tmp_path)["error"]
    assert [c["error_class"] for c in crashes] == ["UnreplayableValue"] * 3
    assert len({c["message"] for c in crashes}) == 1 and KINDS[kind] in crashes[0]["message"]


def test_journal_show_names_the_refusal_of_a_completed_call(tmp_path: Path) -> None:
    run_cli("run", REFUSED, env=_env(tmp_path, 1, TEST_KIND="cycle"))
    (session,) = (tmp_path / "data" / "sessions" / "job-j").glob("*.jsonl")
    shown = run_cli("journal", "show", str(session))
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if "tool call 0" in line)
    assert "completed, result refused: UnreplayableValue" in line and "a cycle" in line


# -- a call left pending ----------------------------------------------------------------------------------


def _leave_pending(tmp_path: Path, tool_name: str) -> None:
    """Attempt 1 starts ``tool_name`` with the time as argument and is SIGKILLed inside it."""
    env = _env(tmp_path, 1, TEST_TOOL=tool_name, TEST_HANG_ATTEMPT="1")
    _kill_when(tmp_path, spawn(PENDING, env), b'"TOOL_STARTED"')
    started = [e for e in _journal(tmp_path) if e["type"] == "TOOL_STARTED"]
    assert len(started) == 1 and started[0]["side_effects"] is (tool_name == "charge")
    assert not [e for e in _journal(tmp_path) if e["type"] in ("TOOL_COMPLETED", "TOOL_FAILED")]


def test_a_pending_read_only_call_runs_again_with_the_new_arguments(tmp_path: Path) -> None:
    _leave_pending(tmp_path, "lookup")
    done = run_cli("run", PENDING, env=_env(tmp_path, 2, TEST_TOOL="lookup"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    assert "ReplayMismatch" not in done.stdout
    assert len(_lines(tmp_path, "lookups")) == 2  # once per attempt: the read ran again
    assert _row(tmp_path) == {"status": "COMPLETED", "error": [], "result": {"found": "found", "attempt": 2}}


def test_a_pending_side_effecting_call_with_other_arguments_is_still_a_replay_mismatch(
    tmp_path: Path,
) -> None:
    _leave_pending(tmp_path, "charge")
    done = run_cli("run", PENDING, env=_env(tmp_path, 2, TEST_TOOL="charge"))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr
    crash = _row(tmp_path)["error"][-1]
    assert crash["error_class"] == "ReplayMismatch" and "job-j/0/0" in crash["message"]
    assert len(_lines(tmp_path, "effects")) == 1  # the effect of attempt 1, not run again blindly
    exits = [line for line in json_lines(done.stdout) if "exit_code" in line]
    assert exits and exits[-1]["exit_code"] == 1


# -- a lone surrogate in what is only shown ----------------------------------------------------------------


def test_an_exception_message_with_a_lone_surrogate_is_an_ordinary_crash_record(tmp_path: Path) -> None:
    done = run_cli("run", "agents.journal_agents:GarbledErrorAgent", env=_env(tmp_path, 1))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr
    assert done.stderr == ""  # no "--- Logging error ---", no internal error
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert all(line.startswith("{") for line in lines) and len(json_lines(done.stdout)) == len(lines)
    crash = _row(tmp_path)["error"][-1]
    assert crash["error_class"] == "ValueError" and crash["message"] == "bad byte \\udcff here"
    (failed,) = [e for e in _journal(tmp_path) if e["type"] == "TOOL_FAILED"]
    assert failed["error"] == "bad byte \\udcff here"
