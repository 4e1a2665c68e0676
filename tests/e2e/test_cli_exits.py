"""The CLI's exits before the lifecycle: signals during imports and commands, sys.exit at import, usage."""

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

import pytest

from procs import REPO, agent_env, cli_in_process, run_cli, spawn, terminate, wait_for, wait_for_handler


@pytest.mark.parametrize("how", ["sleep", "spin", "swallow"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_agent_module_imports_ends_the_process_at_once_with_143(
    tmp_path: Path, how: str, sig: signal.Signals
) -> None:
    marker = tmp_path / "importing"
    env = agent_env(
        tmp_path / "data", AGENTLIFE_JOB_ID="job-i", SLOW_IMPORT=how, SLOW_IMPORT_MARKER=str(marker)
    )
    proc = spawn("agents.slow_import_agent:SlowImportAgent", env)
    wait_for(marker)
    code, elapsed, out = terminate(proc, sig)
    assert code == 143, out
    assert elapsed < 5.0  # at once (the signal repeats every 0.1 s): not the 25 s the import would take
    assert f"drained by {sig.name} while importing" in out
    assert not (tmp_path / "data" / "agentlife.db").exists()  # nothing of the job was touched


def test_an_import_that_never_lets_python_see_the_signal_ends_at_the_cleanup_budget(tmp_path: Path) -> None:
    """The main thread cannot run the handler: the signal is seen from C, and the budget still holds."""
    marker = tmp_path / "importing"
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="job-m",
        AGENTLIFE_DRAIN_CLEANUP_BUDGET_SECONDS="1",
        SLOW_IMPORT="masked",
        SLOW_IMPORT_MARKER=str(marker),
    )
    proc = spawn("agents.slow_import_agent:SlowImportAgent", env)
    wait_for(marker)
    code, elapsed, out = terminate(proc, signal.SIGTERM)
    assert code == 143, out
    assert elapsed < 15.0  # the 1 s budget, with room for a loaded machine: not the 25 s import
    assert "drain budget of 1.0s exceeded" in out
    assert not (tmp_path / "data" / "agentlife.db").exists()


@pytest.mark.parametrize("status", ["0", "7"])
def test_an_agent_module_calling_sys_exit_at_import_is_a_usage_error(tmp_path: Path, status: str) -> None:
    env = agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="job-x", EXIT_AT_IMPORT=status)
    done = run_cli("run", "agents.exit_at_import_agent:Anything", env=env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and f"called sys.exit({status})" in done.stderr


@pytest.mark.parametrize("command", ["run", "worker"])
def test_a_base_exception_at_import_is_one_masked_usage_error(tmp_path: Path, command: str) -> None:
    token = "cp-token-Zq81xV0"
    env = agent_env(
        tmp_path / "data",
        AGENTLIFE_JOB_ID="job-x",
        RAISE_AT_IMPORT="base",
        AGENTLIFE_CONTROL_PLANE_URL="http://127.0.0.1:9",
        AGENTLIFE_CONTROL_PLANE_TOKEN=token,
    )
    done = run_cli(command, "agents.exit_at_import_agent:Anything", env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "importing module 'agents.exit_at_import_agent' failed: AgentImportAborted: token" in done.stderr
    assert token not in done.stderr + done.stdout


@pytest.mark.parametrize("command", ["run", "worker"])
def test_a_keyboard_interrupt_the_module_raises_at_import_is_a_usage_error(
    tmp_path: Path, command: str
) -> None:
    # No signal came (the CLI's handler would have made a real Ctrl-C a drain): the module raised it.
    env = agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="job-x", RAISE_AT_IMPORT="keyboard")
    done = run_cli(command, "agents.exit_at_import_agent:Anything", env=env)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr
        == "agentlife: error: importing module 'agents.exit_at_import_agent' failed: KeyboardInterrupt\n"
    )


def test_a_missing_job_id_is_a_usage_error(tmp_path: Path) -> None:
    done = run_cli("run", "agents.sync_step_agent:SyncStepAgent", env=agent_env(tmp_path / "data"))
    assert done.returncode == 2
    assert "no job id" in done.stderr and done.stderr.count("\n") == 1


def test_a_sync_step_is_refused_before_anything_runs(tmp_path: Path) -> None:
    env = agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="job-s")
    done = run_cli("run", "agents.sync_step_agent:SyncStepAgent", env=env)
    assert done.returncode == 2
    assert "step must be 'async def" in done.stderr
    assert not (tmp_path / "data").exists()
    main = subprocess.run(
        [sys.executable, str(REPO / "tests" / "agents" / "sync_step_agent.py"), "--job-id", "job-s"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert main.returncode == 2 and "async def" in main.stderr


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A listening TCP socket that never says a word (a hung database); accept() shows a client came."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(60)
        yield server


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentlife", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_db_init_against_a_server_that_never_answers_ends_on_a_signal(
    tmp_path: Path, silent_server: socket.socket, sig: signal.Signals, code: int
) -> None:
    port = silent_server.getsockname()[1]
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=f"postgresql://u:p@127.0.0.1:{port}/db")
    proc = _cli("db", "init", env=env)
    # Connected: past the imports (a SIGINT there would be Python's own KeyboardInterrupt, -2), waiting for
    # an answer that never comes. A fixed sleep instead lost that race on a loaded machine.
    client, _ = silent_server.accept()
    with client:
        assert proc.poll() is None
        got, elapsed, out = terminate(proc, sig)
    assert got == code, out
    assert elapsed < 10.0  # the server never answers: without the signal's handling, never


def test_journal_show_on_a_fifo_ends_on_sigterm(tmp_path: Path) -> None:
    fifo = tmp_path / "session.jsonl"
    os.mkfifo(fifo)
    proc = _cli("journal", "show", str(fifo), env=agent_env(tmp_path / "data"))
    wait_for_handler(proc)
    time.sleep(0.3)  # then blocked opening the FIFO: no writer will ever come
    assert proc.poll() is None
    got, elapsed, _ = terminate(proc, signal.SIGTERM)
    assert got == 143
    assert elapsed < 10.0  # no writer ever comes: without the signal's handling, never


# A lone surrogate (an escaped half of a UTF-16 pair) parses as JSON but cannot be encoded as UTF-8: no
# store, journal or checkpoint could hold it.
_LONE_SURROGATES = ['"\\ud800"', '{"a": "x\\udfff"}', '{"\\ud83d": 1}', '["\\ud83d\\ude00", "\\ude00"]']


@pytest.mark.parametrize("payload", _LONE_SURROGATES)
def test_a_payload_with_a_lone_surrogate_is_a_usage_error_for_run_and_job_create(
    tmp_path: Path, payload: str
) -> None:
    env = agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="job-p")
    run = run_cli("run", "agents.drain_agent:DrainAgent", "--payload", payload, env=env)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr
    assert run.stderr.count("\n") == 1 and "--payload" in run.stderr and "lone surrogate" in run.stderr
    assert run.stdout == "" and not (tmp_path / "data").exists()  # no row, no journal, no directory

    # The store and the argument's refusal in this process (cli_in_process); the payload read from stdin
    # by a real one, so each variant still sees both commands' exit code from a process.
    assert cli_in_process("db", "init", env=env).returncode == 0
    given = cli_in_process("job", "create", "drain-agent", "--payload", payload, env=env)
    from_stdin = subprocess.run(
        [sys.executable, "-m", "agentlife", "job", "create", "drain-agent", "--payload", "-"],
        env=env,
        cwd=REPO,
        input=payload,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    for create in (given, from_stdin):
        assert create.returncode == 2, create.stdout + create.stderr
        assert create.stderr.count("\n") == 1 and "lone surrogate" in create.stderr
    listed = cli_in_process("job", "list", "--json", env=env)
    assert listed.returncode == 0 and listed.stdout == ""  # no row was created


def test_a_payload_with_an_escaped_surrogate_pair_is_the_character_it_encodes(tmp_path: Path) -> None:
    env = agent_env(tmp_path / "data", AGENTLIFE_JOB_ID="job-p")
    assert run_cli("db", "init", env=env).returncode == 0
    made = run_cli(
        "job", "create", "drain-agent", "--id", "job-q", "--payload", '{"e": "\\ud83d\\ude00"}', env=env
    )
    assert made.returncode == 0, made.stderr
    (row,) = [json.loads(line) for line in run_cli("job", "list", "--json", env=env).stdout.splitlines()]
    assert row["payload"] == {"e": "\N{GRINNING FACE}"}


_STUCK_CLEANUP = """
import signal, sys, time
from agentlife._cli._common import end_on_signals
end_on_signals()
print("ready", flush=True)
while True:  # a cleanup that never finishes: every SystemExit the handler raises is swallowed
    try:
        time.sleep(60)
    except SystemExit:
        continue
"""


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_command_whose_cleanup_never_finishes_still_leaves_soon_after_a_signal(
    sig: signal.Signals, code: int
) -> None:
    """asyncio's shutdown can wait for ever on a task the signal's SystemExit left half set up."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK_CLEANUP], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    got, elapsed, out = terminate(proc, sig)
    assert got == code, out
    assert elapsed < 15.0  # the promise is a 2 s grace; without the armed exit, never
