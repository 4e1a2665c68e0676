"""Masking in real ``python -m agentlife run`` processes: big results never freeze the loop, and a database
password holding spaces, quotes or a tab never reaches the logs or the journal.

The unit and property tests of the redactor are in tests/test_redact.py; these prove it wired into the
runtime: the journal, the JSON log handler and the probe server of a real process, over real HTTP and a
real PostgreSQL server.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from _pg import PostgresServer
from agentlife._journal._writer import list_sessions
from procs import REPO, agent_env, run_cli

HEX_BYTES = 1_000_000


def _start(target: str, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    # Output goes to a file: a pipe nobody reads would block the agent on a full buffer.
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "agentlife", "run", target, *args],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _probe_port(proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_bytes().splitlines():
            if line.startswith(b"{") and b"probe_listening" in line:
                return int(orjson.loads(line)["port"])
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        time.sleep(0.01)
    raise TimeoutError(f"no probe_listening line in {timeout}s")


def _wait_for(path: Path, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
        assert time.monotonic() < deadline, f"{path.name} not reached in {timeout}s"
        time.sleep(0.01)


def _journal(data_dir: Path, job_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in list_sessions(data_dir / "sessions" / job_id):
        events += [orjson.loads(raw) for raw in path.read_bytes().splitlines() if raw.strip()]
    return events


@pytest.mark.timeout(240)
def test_tools_returning_a_megabyte_of_hex_complete_and_healthz_answers_meanwhile(tmp_path: Path) -> None:
    # Before, masking one such result backtracked for hours with the GIL held: the job froze and the
    # probe server (a thread) could not answer. pytest-timeout is the guard; no time is asserted.
    markers = tmp_path / "markers"
    markers.mkdir()
    env = agent_env(tmp_path / "data", TEST_MARKER_DIR=str(markers), TEST_HEX_BYTES=str(HEX_BYTES))
    log = tmp_path / "agent.log"
    proc = _start("agents.redact_agents:HexFloodAgent", env, log, "--job-id", "hex")
    try:
        port = _probe_port(proc, log)
        _wait_for(markers / "called-0", proc, log, timeout=120)  # one result journaled, masked, logged
        answers = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as client:
            # Probe until three more results went through the journal and the masking: the answers are
            # given while the loop is busy with megabytes, not before or after.
            while not (markers / "called-3").exists() or len(answers) < 3:
                assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
                response = client.get("/healthz")
                answers.append((response.status_code, response.text.strip()))
                time.sleep(0.05)
        (markers / "go").touch()
        assert proc.wait(timeout=180) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert set(answers) == {(200, "ok")}
    results = [e for e in _journal(tmp_path / "data", "hex") if e.get("type") == "TOOL_COMPLETED"]
    assert results, "no tool result journaled"
    for event in results:  # journaled whole: nothing in random hex looks like a secret
        assert isinstance(event["result"], str) and len(event["result"]) == HEX_BYTES
        assert set(event["result"]) <= set("0123456789abcdef")


def _leaky_role(server: PostgresServer, password: str) -> str:
    """A login role whose password is ``password``, and a URL for it on a fresh schema (raw in the URL)."""
    role = f"leaky_{secrets.token_hex(4)}"
    server.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password.replace(chr(39), chr(39) * 2)}'")
    schema_url = server.create_schema("leaky")
    rest = schema_url.split("@", 1)[1]
    # A tab is percent-encoded (URL parsers drop a raw one); the space and the quotes are left raw.
    in_url = password.replace("\t", "%09")
    return f"postgresql://{role}:{in_url}@{rest}"


@pytest.mark.parametrize("password", ["hun ter2 it's", 'tab\there "quoted"', "s p'a\"c%e"])
def test_a_database_password_with_spaces_quotes_or_a_tab_never_reaches_logs_or_journal(
    tmp_path: Path, postgres_server: PostgresServer, password: str
) -> None:
    postgres_server.start()
    url = _leaky_role(postgres_server, password)
    markers = tmp_path / "markers"
    markers.mkdir()
    env = agent_env(
        tmp_path / "data",
        TEST_MARKER_DIR=str(markers),
        AGENTLIFE_DATABASE_URL=url,
        TEST_DB_SPELLED_OUT=password,
    )
    init = run_cli("db", "init", env=env)
    assert init.returncode == 0, init.stderr
    log = tmp_path / "agent.log"
    proc = _start("agents.redact_agents:LeakyDatabaseUrlAgent", env, log, "--job-id", "leak", "--create-job")
    try:
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text(errors="replace")
    assert code == 0, output[-4000:]
    output += init.stdout + init.stderr
    journal = _journal(tmp_path / "data", "leak")
    written = output + orjson.dumps(journal).decode() + json.dumps(journal)
    # The lines were written (masked), so their absence below is not the absence of the lines.
    assert (
        "schema ready at postgresql://" in output
        and "database is postgresql://" in output
        and "connecting by hand failed" in output
    )
    assert any(e.get("type") == "TOOL_COMPLETED" for e in journal)
    in_url = password.replace("\t", "%09")
    for spelled in {password, in_url, repr(password)[1:-1], json.dumps(password)[1:-1]}:
        assert spelled not in written, spelled
    assert urllib.parse.quote(password) not in written
    for fragment in ("hun ter", "tab\there", "tab\\there", "s p'a"):
        assert fragment not in written
