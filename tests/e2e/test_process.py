"""Real ``python -m agentlife run`` processes, real signals, real exit codes."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import orjson
import pytest

from procs import agent_env, json_lines, run_cli, spawn, terminate, wait_for


def _checkpoint(data_dir: Path, job_id: str) -> dict[str, object]:
    conn = sqlite3.connect(data_dir / "agentlife.db")
    try:
        (blob,) = conn.execute("SELECT checkpoint FROM job WHERE id = ?", (job_id,)).fetchone()
    finally:
        conn.close()
    doc = orjson.loads(blob)
    assert isinstance(doc, dict)
    return doc


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    return agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="job-p", TEST_MARKER_DIR=str(markers), **extra)


def test_sigterm_between_steps_exits_143_promptly(tmp_path: Path) -> None:
    env = _env(tmp_path, TEST_STEPS="100000", TEST_STEP_SECONDS="0.005")
    proc = spawn("agents.drain_agent:DrainAgent", env)
    wait_for(tmp_path / "markers" / "step-20-done")
    code, elapsed, output = terminate(proc)
    assert code == 143, output
    assert elapsed < 10.0  # between 5 ms steps: no 45 s step deadline waited for
    doc = _checkpoint(tmp_path / "data", "job-p")
    assert doc["next_step"] >= 21
    assert doc["state"]["done_steps"] == list(range(doc["next_step"]))  # type: ignore[index]
    logs = json_lines(output)
    assert any(line.get("msg") == "drain requested by SIGTERM" for line in logs)
    # The transition is logged from the signal receiver's task, and still names the job.
    (moved,) = [line for line in logs if line.get("transition_to") == "DRAINING"]
    assert (moved["job_id"], moved["attempt"], moved["transition_from"]) == ("job-p", 1, "EXECUTING")


def test_sigterm_inside_a_tool_that_finishes_in_time(tmp_path: Path) -> None:
    env = _env(
        tmp_path,
        TEST_STEPS="6",
        TEST_TOOL_STEP="2",
        TEST_TOOL_SECONDS="0.6",
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="5",
        AGENTLIFE_DRAIN_TERMINATION_GRACE_SECONDS="25",
    )
    proc = spawn("agents.drain_agent:DrainAgent", env)
    wait_for(tmp_path / "markers" / "tool-started-job-p_2_0")
    code, elapsed, output = terminate(proc)
    assert code == 143, output
    assert (tmp_path / "markers" / "tool-finished-job-p_2_0").exists()
    assert _checkpoint(tmp_path / "data", "job-p")["next_step"] == 3
    assert elapsed < 5.0  # the promise: inside the 5 s step deadline (the tool needed 0.6 s of it)
    exit_line = next(line for line in json_lines(output) if str(line.get("msg", "")).startswith("exit 143"))
    assert (
        exit_line["msg"] == "exit 143: drained by SIGTERM during step 2, which finished and was checkpointed"
    )


def test_sigterm_inside_a_tool_that_outlives_the_deadline_then_resume(tmp_path: Path) -> None:
    env = _env(
        tmp_path,
        TEST_STEPS="4",
        TEST_TOOL_STEP="1",
        TEST_TOOL_SECONDS="60",
        AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="1",
        AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS="2",
    )
    proc = spawn("agents.drain_agent:DrainAgent", env)
    wait_for(tmp_path / "markers" / "tool-started-job-p_1_0")
    code, elapsed, output = terminate(proc)
    assert code == 143, output
    assert 0.9 <= elapsed < 3.0  # about the 1 s deadline
    assert not (tmp_path / "markers" / "tool-finished-job-p_1_0").exists()
    doc = _checkpoint(tmp_path / "data", "job-p")
    assert doc["next_step"] == 1  # nothing checkpointed for the cancelled step

    rerun = spawn(
        "agents.drain_agent:DrainAgent", {**env, "AGENTLIFE_ATTEMPT": "2", "TEST_TOOL_SECONDS": "0"}
    )
    out, err = rerun.communicate(timeout=60)
    assert rerun.returncode == 0, (out + err).decode()
    final = _checkpoint(tmp_path / "data", "job-p")
    assert final["state"]["done_steps"] == [0, 1, 2, 3]  # type: ignore[index]


def test_sigint_drains_like_sigterm(tmp_path: Path) -> None:
    env = _env(tmp_path, TEST_STEPS="100000", TEST_STEP_SECONDS="0.005")
    proc = spawn("agents.drain_agent:DrainAgent", env)
    wait_for(tmp_path / "markers" / "step-3-done")
    code, _, output = terminate(proc, signal.SIGINT)
    assert code == 143, output


def test_crash_exits_1_with_context_on_the_row(tmp_path: Path) -> None:
    env = _env(
        tmp_path,
        TEST_SECRET_IN_ERROR="sk-ant-api03-PLANTEDSECRET",
        ANTHROPIC_API_KEY="sk-ant-api03-PLANTEDSECRET",
    )
    proc = spawn("agents.drain_agent:CrashAgent", env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    text = (out + err).decode()
    assert "PLANTEDSECRET" not in text
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    (error,) = conn.execute("SELECT error FROM job WHERE id = 'job-p'").fetchone()
    conn.close()
    records = orjson.loads(error)
    assert records[0]["error_class"] == "RuntimeError" and "boom in step 1" in records[0]["message"]
    assert "PLANTEDSECRET" not in error


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "no_such_module:Agent"], "cannot import module 'no_such_module'"),
        (["run", "agents.drain_agent"], "is not MODULE:CLASS"),
        (["run", "agents.drain_agent:Missing"], "has no attribute 'Missing'"),
        (["run", "agents.drain_agent:NotAnAgent"], "is not an AgentProcess subclass"),
        (["run", "agents.drain_agent:DrainAgent", "--payload", "{not json"], "--payload is not valid JSON"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_errors_are_one_line_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    result = run_cli(*args, env=_env(tmp_path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_bad_env_value_is_one_line_exit_2(tmp_path: Path) -> None:
    result = run_cli(
        "run",
        "agents.drain_agent:DrainAgent",
        env=_env(tmp_path, AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="soon"),
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "agentlife: error: AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS='soon' is not a number of seconds"
    )


def test_invariant_violation_names_both_sides(tmp_path: Path) -> None:
    result = run_cli("check", env=_env(tmp_path, AGENTLIFE_DRAIN_STEP_DEADLINE_SECONDS="55"))
    assert result.returncode == 2
    assert "= 75 s must be <= termination_grace = 65 s" in result.stderr
    ok = run_cli("check", env=_env(tmp_path))
    assert ok.returncode == 0 and "all invariants hold" in ok.stdout


@pytest.mark.parametrize("job_id", ["../../escape", "a/b", "x" * 200])
def test_bad_job_id_exits_1_and_touches_nothing_outside(tmp_path: Path, job_id: str) -> None:
    env = _env(tmp_path)
    result = run_cli("run", "agents.drain_agent:DrainAgent", "--job-id", job_id, env=env)
    assert result.returncode == 1
    assert "is not allowed" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "escape").exists()
    assert {p.name for p in tmp_path.iterdir()} <= {"data", "markers"}


def test_db_init_creates_the_schema(tmp_path: Path) -> None:
    result = run_cli("db", "init", env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert {"job", "checkpoint_history", "delivery", "conversation"} <= tables


def test_help_on_every_command() -> None:
    for args in (
        ["--help"],
        ["run", "--help"],
        ["check", "--help"],
        ["db", "init", "--help"],
        ["demo", "--help"],
    ):
        result = run_cli(*args)
        assert result.returncode == 0 and "usage:" in result.stdout, args


def test_sigterm_while_the_agent_module_imports_drains_with_143(tmp_path: Path) -> None:
    # The CLI's EarlySignal abandons the import: nothing of the job exists yet, so nothing waits for it.
    proc = spawn("agents.early_signal_agent:EarlySignalAgent", _env(tmp_path))
    out, err = proc.communicate(timeout=30)
    output = (out + err).decode(errors="replace")
    assert proc.returncode == 143, output
    exits = [line for line in json_lines(output) if str(line.get("msg", "")).startswith("exit 143")]
    assert exits and "drained by SIGTERM while importing" in str(exits[0]["msg"]), output
