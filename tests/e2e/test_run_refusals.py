"""What ``python -m agentlife check`` and ``run`` refuse, and how: one validation for both, a
payload too deep for the store, ``--max-seconds 0``, a side effect whose result is cyclic.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentlife._journal._writer import list_sessions
from procs import agent_env, run_cli

TOKEN = "cp-token-5f2a9c7e"


def _journal_lines(data_dir: Path, job_id: str) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in list_sessions(data_dir / "sessions" / job_id):
        lines += [orjson.loads(raw) for raw in path.read_bytes().splitlines() if raw.strip()]
    return lines


# -- secret masking ------------------------------------------------------------------------------------


def test_a_cyclic_side_effect_result_is_one_clean_refusal_not_a_recursion_crash(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    env = agent_env(tmp_path / "data", TEST_MARKER_DIR=str(markers), AGENTLIFE_CONTROL_PLANE_TOKEN=TOKEN)
    result = run_cli("run", "agents.hardening_agents:CyclicResultAgent", "--job-id", "cyc", env=env)
    # The result cannot be journaled exactly, so it is refused where it enters: a crash record naming the
    # cycle. Masking it on the way (logs, journal, row) must neither recurse nor print the token.
    assert result.returncode == 1
    assert len((markers / "cyclic").read_text().splitlines()) == 1  # the effect ran once in this attempt
    output = result.stdout + result.stderr
    assert "RecursionError" not in output and "a cycle" in output
    assert TOKEN not in output
    journal = _journal_lines(tmp_path / "data", "cyc")
    assert journal[-1]["type"] == "SESSION_ENDED" and journal[-1]["exit_code"] == 1
    assert TOKEN not in orjson.dumps(journal).decode()


# -- one validation for check and run --------------------------------------------------------------------

_BAD_ENV = [
    ("AGENTLIFE_HEARTBEAT_JOB_INTERVAL_SECONDS", "0"),
    ("AGENTLIFE_PROBE_LAG_INTERVAL_SECONDS", "0"),
    ("AGENTLIFE_BUDGET_MAX_INPUT_TOKENS", "100000000000000000000000"),
    ("AGENTLIFE_ATTEMPT", "2147483648"),
    ("AGENTLIFE_ATTEMPT", "99999999999999999999"),
    ("AGENTLIFE_QDRANT_URL", "http://127.0.0.1:99999"),
    ("AGENTLIFE_CONTROL_PLANE_URL", "http://127.0.0.1:99999"),
    ("AGENTLIFE_DATABASE_URL", "postgresql://u:p@127.0.0.1:99999/db"),
    ("AGENTLIFE_DATABASE_URL", "sqlite:"),
    ("AGENTLIFE_DATABASE_URL", "sqlite://"),
    ("AGENTLIFE_DATABASE_URL", "sqlite:///"),
    ("AGENTLIFE_DATABASE_URL", "sqlite:///:memory:"),
]


@pytest.mark.parametrize(("name", "value"), _BAD_ENV)
def test_check_and_run_refuse_the_same_bad_values(tmp_path: Path, name: str, value: str) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = agent_env(tmp_path / "data", **{name: value})
    for args in (["check"], ["run", "agents.drain_agent:DrainAgent", "--job-id", "j"]):
        result = subprocess.run(
            [sys.executable, "-m", "agentlife", *args],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, (args, result.stdout[-500:], result.stderr[-500:])
        assert result.stderr.count("\n") == 1 and name in result.stderr, result.stderr
    assert not (tmp_path / "data").exists()
    assert list(cwd.iterdir()) == []  # no sqlite file in the current directory


def test_a_payload_nested_deeper_than_the_store_accepts_is_a_usage_error(tmp_path: Path) -> None:
    env = agent_env(tmp_path / "data")
    payload = "[" * 200 + "]" * 200
    result = run_cli("run", "agents.drain_agent:DrainAgent", "--job-id", "j", "--payload", payload, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--payload" in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("value", ["0", "0.0", "-0", "-0.0"])
def test_run_max_seconds_zero_means_unlimited_in_every_spelling(tmp_path: Path, value: str) -> None:
    env = agent_env(tmp_path / "data", TEST_STEPS="2", AGENTLIFE_RUN_MAX_SECONDS=value)
    result = run_cli("run", "agents.drain_agent:DrainAgent", "--job-id", "j", env=env)
    assert result.returncode == 0, result.stderr[-1000:]
    conn = sqlite3.connect(tmp_path / "data" / "agentlife.db")
    try:
        assert conn.execute("SELECT status FROM job WHERE id = 'j'").fetchone() == ("COMPLETED",)
    finally:
        conn.close()
