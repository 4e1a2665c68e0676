"""Replay checks what it replays, and a replayed value equals the live one (real processes, SIGKILL)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from agentlife import tool
from agentlife._replay import tool_call_digest
from procs import REPO, agent_env, run_cli, spawn, wait_for

AGENT = "agents.replay_agent:ReplayAgent"
RERUN = "agents.replay_agent:RerunReplayAgent"


def _env(tmp_path: Path, attempt: int, **extra: str) -> dict[str, str]:
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    return agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="job-r",
        AGENTLIFE_ATTEMPT=str(attempt),
        REPLAY_LOG=str(log),
        **extra,
    )


def _kill_after_calls(tmp_path: Path, target: str = AGENT, attempt: int = 1, **calls: str) -> None:
    """An attempt makes its calls (journaled, no checkpoint covers them) and is SIGKILLed."""
    (tmp_path / "log" / "calls_done").unlink(missing_ok=True)
    proc = spawn(target, _env(tmp_path, attempt, REPLAY_HANG="1", **calls))
    try:
        wait_for(tmp_path / "log" / "calls_done")
        _wait_until_journaled(tmp_path, b'"LLM_COMPLETED"')  # buffered: flushed within a second
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)


def _wait_until_journaled(tmp_path: Path, needle: bytes, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(needle in p.read_bytes() for p in (tmp_path / "data" / "sessions").glob("*/*.jsonl")):
            return
        time.sleep(0.02)
    raise TimeoutError(f"{needle!r} never reached the journal")


def _resume(tmp_path: Path, target: str = AGENT, attempt: int = 2, **calls: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "agentlife", "run", target],
        env=_env(tmp_path, attempt, **calls),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def _row(tmp_path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    try:
        status, error, result = conn.execute(
            "SELECT status, error, result FROM job WHERE id='job-r'"
        ).fetchone()
    finally:
        conn.close()
    return {
        "status": status,
        "error": orjson.loads(error) if error else [],
        "result": orjson.loads(result) if result else None,
    }


def _effects(tmp_path: Path) -> list[str]:
    return (tmp_path / "log" / "effects").read_text().splitlines()


INVOICE = {"REPLAY_TOOL": "send_invoice", "REPLAY_AMOUNT": "100"}
REFUND = {"REPLAY_TOOL": "send_refund", "REPLAY_AMOUNT": "999"}


def test_a_different_tool_at_the_same_call_number_is_a_replay_mismatch_not_the_old_result(
    tmp_path: Path,
) -> None:
    _kill_after_calls(tmp_path, **INVOICE)
    code, out = _resume(tmp_path, **REFUND)
    assert code == 1, out
    row = _row(tmp_path)
    assert row["status"] == "RUNNING"  # a crash: the control plane decides about the next attempt
    crash = row["error"][-1]
    assert crash["error_class"] == "ReplayMismatch"
    assert "job-r/0/0" in crash["message"]
    assert "send_invoice" in crash["message"] and "send_refund" in crash["message"]
    assert "999" not in crash["message"] and "100" not in crash["message"]  # names and digests only
    assert _effects(tmp_path) == ["job-r/0/0 invoice 100"]  # the refund was not silently skipped...
    assert row["result"] is None  # ...and the job did not end COMPLETED on the invoice's result


def test_the_same_tool_with_other_arguments_is_a_replay_mismatch(tmp_path: Path) -> None:
    _kill_after_calls(tmp_path, **INVOICE)
    code, out = _resume(tmp_path, REPLAY_TOOL="send_invoice", REPLAY_AMOUNT="101")
    assert code == 1, out
    assert _row(tmp_path)["error"][-1]["error_class"] == "ReplayMismatch"
    assert _effects(tmp_path) == ["job-r/0/0 invoice 100"]


def test_a_changed_llm_request_is_a_replay_mismatch(tmp_path: Path) -> None:
    _kill_after_calls(tmp_path, **INVOICE, REPLAY_PROMPT="hello")
    code, out = _resume(tmp_path, **INVOICE, REPLAY_PROMPT="hello, in French")
    assert code == 1, out
    crash = _row(tmp_path)["error"][-1]
    assert crash["error_class"] == "ReplayMismatch"
    assert "job-r/0/1" in crash["message"] and "LLM claude-test" in crash["message"]
    assert "French" not in crash["message"]


def test_an_unchanged_step_replays_without_running_anything_again(tmp_path: Path) -> None:
    _kill_after_calls(tmp_path, **INVOICE)
    code, out = _resume(tmp_path, **INVOICE)
    assert code == 0, out
    row = _row(tmp_path)
    assert row["status"] == "COMPLETED"
    assert row["result"] == {"sent": "invoice 100", "reply": "noted"}
    assert _effects(tmp_path) == ["job-r/0/0 invoice 100"]


def test_rerun_runs_the_changed_step_afresh_and_a_second_resume_keeps_the_new_record(tmp_path: Path) -> None:
    _kill_after_calls(tmp_path, **INVOICE)
    _kill_after_calls(tmp_path, RERUN, 2, **REFUND)  # the rerun runs the refund, then is killed too
    code, out = _resume(tmp_path, RERUN, 3, **REFUND)
    assert code == 0, out
    assert "replay mismatch" not in out  # the journal's REPLAY_DISCARDED and the refund's record decide
    assert _row(tmp_path)["result"]["sent"] == "refund 999"
    assert _effects(tmp_path) == ["job-r/0/0 invoice 100", "job-r/0/0 refund 999"]


def test_rerun_logs_the_mismatch_and_runs_the_changed_call(tmp_path: Path) -> None:
    _kill_after_calls(tmp_path, **INVOICE)
    code, out = _resume(tmp_path, RERUN, **REFUND)
    assert code == 0, out
    assert "replay mismatch at job-r/0/0" in out
    assert _effects(tmp_path) == ["job-r/0/0 invoice 100", "job-r/0/0 refund 999"]


def test_rerun_asks_verify_before_running_a_voided_side_effecting_call_again(tmp_path: Path) -> None:
    _kill_after_calls(tmp_path, **INVOICE)
    # The billing system already holds a refund under this idempotency key (an attempt whose journal
    # was lost): the voided call number must go through verify, not run the refund a second time.
    with (tmp_path / "log" / "effects").open("a") as f:
        f.write("job-r/0/0 refund 999\n")
    code, out = _resume(tmp_path, RERUN, **REFUND)
    assert code == 0, out
    assert "verified as already done" in out
    assert _effects(tmp_path) == ["job-r/0/0 invoice 100", "job-r/0/0 refund 999"]


def test_payload_numbers_beyond_float_precision_reach_the_agent_exactly_or_are_refused(
    tmp_path: Path,
) -> None:
    env = _env(tmp_path, 1)
    big = run_cli(
        "run", "agents.replay_agent:ReplayAgent", "--payload", '{"a":123456789012345678901234567890}', env=env
    )
    assert big.returncode == 2
    assert big.stderr.strip().count("\n") == 0
    assert "64-bit" in big.stderr and "--payload" in big.stderr
    assert not (tmp_path / "data" / "agentlife.db").exists()  # nothing written
    nan = run_cli("run", AGENT, "--payload", '{"a": NaN}', env=env)
    assert nan.returncode == 2 and "NaN" in nan.stderr


def test_payload_ints_within_64_bits_are_stored_exactly(tmp_path: Path) -> None:
    code = run_cli(
        "run",
        AGENT,
        "--payload",
        '{"a": 18446744073709551615, "b": 9007199254740993}',
        env=_env(tmp_path, 1, **INVOICE),
    )
    assert code.returncode == 0, code.stderr
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    (payload,) = conn.execute("SELECT payload FROM job WHERE id='job-r'").fetchone()
    conn.close()
    assert orjson.loads(payload) == {"a": 18446744073709551615, "b": 9007199254740993}


# ---------------------------------------------------------------------------------------- in process


def test_llm_calls_are_journaled_at_start_and_journal_show_names_model_and_duration(tmp_path: Path) -> None:
    done = run_cli("run", AGENT, env=_env(tmp_path, 1, **INVOICE))
    assert done.returncode == 0, done.stderr
    (session,) = (tmp_path / "data" / "sessions" / "job-r").glob("*.jsonl")
    events = [orjson.loads(line) for line in session.read_bytes().splitlines()]
    started = [e for e in events if e["type"] == "LLM_STARTED"]
    completed = [e for e in events if e["type"] == "LLM_COMPLETED"]
    assert len(started) == 1 and started[0]["model"] == "claude-test" and started[0]["call"] == 1
    assert started[0]["digest"] == completed[0]["digest"]
    tool_started = next(e for e in events if e["type"] == "TOOL_STARTED")
    assert tool_started["digest"] == tool_call_digest("send_invoice", {"amount": 100})
    shown = run_cli("journal", "show", str(session))
    assert shown.returncode == 0
    llm_line = next(line for line in shown.stdout.splitlines() if "llm call 1" in line)
    assert "claude-test" in llm_line and "ms)" in llm_line


# -------------------------------------------------------- replay in a step (a real StepContext and journal)

_runs: list[str] = []


@tool(side_effects=True, verify=lambda invocation_id: _verified_cycle(invocation_id))
async def refund(amount: int) -> str:
    _runs.append(f"refund {amount}")
    return "refunded"


async def _verified_cycle(invocation_id: str) -> Any:
    _runs.append("verify")
    found: dict[str, Any] = {}
    found["again"] = found
    return found
