"""Hardening: secret masking, short journal writes, quiet fresh jobs, one validation for check and run,
data-dir containment, same-attempt claims and retries of side-effecting tools.

Real ``python -m agentlife`` processes where the defect lives in the process (the CLI's error paths, the
journal's file, two processes claiming one job); a real PostgreSQL server for the claim on PostgreSQL.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import orjson
import pytest

from agentlife import AgentProcess, AttemptFenced, Done, StepContext, tool
from agentlife._journal._recovery import scan_for_resume
from agentlife._journal._writer import list_sessions
from agentlife._redact import MASK, Redactor
from agentlife.stores import PostgresStore, SQLiteStore
from agentlife.testing import AgentHarness
from procs import REPO, agent_env, json_lines, run_cli, spawn, wait_for

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


def test_redact_obj_is_bounded_and_never_raises() -> None:
    r = Redactor([TOKEN])
    deep: Any = TOKEN
    for _ in range(20_000):  # far past the interpreter's recursion limit
        deep = [deep]
    masked = r.redact_obj(deep)
    for _ in range(254):
        masked = masked[0]
    assert masked == "<nested too deep: list>"
    shared = [TOKEN]
    assert r.redact_obj({"a": shared, "b": shared}) == {"a": [MASK], "b": [MASK]}  # shared is no cycle


@pytest.mark.parametrize("password", ["pa/ss#w?rd", "p@ss/word", "pass?word", "hash#tag99"])
def test_url_passwords_with_reserved_characters_are_masked_whole(password: str) -> None:
    url = f"postgresql://agent:{password}@db.internal:5432/jobs"
    r = Redactor.from_env({"AGENTLIFE_DATABASE_URL": url})
    for text in (f"cannot connect to {url}: refused", f"password was {password}"):
        out = r.redact(text)
        assert password not in out and "ss/word" not in out and "word@" not in out, out
    assert Redactor().redact(f"dsn {url} x") == f"dsn postgresql://agent:{MASK}@db.internal:5432/jobs x"


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_database_password_with_reserved_characters_never_reaches_output(
    tmp_path: Path, command: str
) -> None:
    url = "postgresql://agent:pa/ss#w?rd@127.0.0.1:1/jobs"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url)
    args = ["run", "agents.drain_agent:DrainAgent", "--job-id", "j"] if command == "run" else ["check"]
    result = run_cli(*args, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "AGENTLIFE_DATABASE_URL" in result.stderr
    assert "ss#w" not in result.stderr + result.stdout and "pa/ss" not in result.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("where", ["import", "init"])
def test_a_token_quoted_before_the_lifecycle_starts_is_masked(tmp_path: Path, where: str) -> None:
    extra = {"TEST_LEAK_AT_IMPORT": "1"} if where == "import" else {}
    env = agent_env(tmp_path / "data", AGENTLIFE_CONTROL_PLANE_TOKEN=TOKEN, **extra)
    target = "agents.hardening_agents:" + ("CyclicResultAgent" if where == "import" else "LeakyInitAgent")
    result = run_cli("run", target, "--job-id", "j", env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert TOKEN not in result.stderr + result.stdout
    assert MASK in result.stderr
    assert not (tmp_path / "data").exists()


# -- journal short writes ------------------------------------------------------------------------------

_SHORT_WRITE_SCRIPT = textwrap.dedent(
    """
    import os, resource, signal, sys
    import anyio
    from agentlife._journal._writer import Journal

    async def main(directory):
        journal = Journal.create(directory, 1)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        # The disk "fills" in the middle of the third line: the kernel takes part of the write.
        resource.setrlimit(resource.RLIMIT_FSIZE, (150, hard))
        for i in range(6):
            journal.append("STEP_STARTED", step=i, pad="x" * 20)
        try:
            await journal.flush(fsync=True)
        except OSError as exc:
            print("flush failed:", exc.errno, flush=True)
        try:
            await journal.flush(fsync=True)  # still full: nothing more may be written twice
        except OSError:
            pass
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space again
        journal.append("STEP_STARTED", step=6, pad="x" * 20)
        await journal.aclose()

    anyio.run(main, sys.argv[1])
    """
)


def test_a_short_write_resumes_where_the_kernel_stopped(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(
        [sys.executable, "-c", _SHORT_WRITE_SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "flush failed: 27" in result.stdout  # EFBIG: the limit was really hit mid-buffer
    (path,) = list_sessions(tmp_path)
    lines = path.read_bytes().splitlines()
    events = [orjson.loads(line) for line in lines]  # every line whole: no torn or doubled bytes
    assert [e["seq"] for e in events] == list(range(7))
    assert [e["step"] for e in events] == list(range(7))


# -- a fresh job does not warn ---------------------------------------------------------------------------


def test_a_fresh_job_logs_no_warning_about_the_journal_scan(tmp_path: Path) -> None:
    env = agent_env(tmp_path / "data", TEST_STEPS="1")
    result = run_cli("run", "agents.drain_agent:DrainAgent", "--job-id", "fresh", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = json_lines(result.stdout)
    scan = [line for line in lines if str(line.get("msg", "")).startswith("journal scan")]
    assert scan and all(line["level"] == "INFO" for line in scan), scan
    assert [line for line in lines if line["level"] == "WARNING"] == []


def test_scan_says_which_outcomes_are_expected(tmp_path: Path) -> None:
    sessions = tmp_path / "s"
    assert scan_for_resume(sessions, None).expected  # fresh job: no directory yet
    sessions.mkdir()
    assert scan_for_resume(sessions, None).expected  # fresh job: no files
    assert not scan_for_resume(sessions, "c1").expected  # a checkpoint but no journal: data lost
    marker = {"v": 1, "ts": 1.0, "seq": 0, "type": "CHECKPOINT_WRITTEN", "step": 2, "checkpoint_id": "c2"}
    (sessions / "session_0001_1.jsonl").write_bytes(orjson.dumps(marker) + b"\n")
    killed = scan_for_resume(sessions, "c3", checkpoint_step=3)  # killed between commit and marker
    assert not killed.found and killed.expected
    (sessions / "session_0001_1.jsonl").write_bytes(b"garbage\n")
    assert not scan_for_resume(sessions, "c3", checkpoint_step=3).expected


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


# -- data-dir containment --------------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["sessions", "sessions/j"])
def test_a_session_symlink_leading_outside_the_data_dir_is_refused(tmp_path: Path, link: str) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    (data / link).parent.mkdir(parents=True)
    (data / link).symlink_to(outside, target_is_directory=True)
    result = run_cli("run", "agents.drain_agent:DrainAgent", "--job-id", "j", env=agent_env(data))
    assert result.returncode == 1
    assert any("outside the data directory" in str(line.get("msg")) for line in json_lines(result.stdout))
    assert list(outside.iterdir()) == []


def test_the_recovery_scan_does_not_follow_a_symlinked_session_file(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere.jsonl"
    secret.write_bytes(b'{"v":1,"ts":1,"seq":0,"type":"CHECKPOINT_WRITTEN","checkpoint_id":null}\n')
    sessions = tmp_path / "sessions" / "j"
    sessions.mkdir(parents=True)
    (sessions / "session_0001_1.jsonl").symlink_to(secret)
    assert list_sessions(sessions) == []
    assert not scan_for_resume(sessions, None).found


# -- two live processes, one attempt ----------------------------------------------------------------------


def test_a_second_process_with_the_same_attempt_loses_the_claim(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    env = agent_env(tmp_path / "data", TEST_MARKER_DIR=str(markers), TEST_TOOL_SECONDS="3")
    first = spawn("agents.hardening_agents:SlowEffectAgent", env, "--job-id", "twin")
    try:
        wait_for(markers / "slow", timeout=30)
        second = run_cli("run", "agents.hardening_agents:SlowEffectAgent", "--job-id", "twin", env=env)
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 1
    assert any("already claimed by a live process" in str(x.get("msg")) for x in json_lines(second.stdout))
    assert first.returncode == 0, err.decode()[-2000:]
    assert len((markers / "slow").read_text().splitlines()) == 1  # the effect ran once, not twice
    # The same attempt may claim again once the first process is gone (a local re-run).
    again = run_cli("run", "agents.hardening_agents:SlowEffectAgent", "--job-id", "twin", env=env)
    assert again.returncode == 0


@pytest.mark.anyio
async def test_sqlite_database_without_the_owner_column_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute(
        "CREATE TABLE job (id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, status TEXT NOT NULL DEFAULT"
        " 'PENDING', payload TEXT, attempt INTEGER NOT NULL DEFAULT 0, checkpoint BLOB, checkpoint_crc"
        " INTEGER, checkpoint_id TEXT, heartbeat_at REAL, tokens_consumed TEXT NOT NULL DEFAULT '{}',"
        " token_budget TEXT, error TEXT NOT NULL DEFAULT '[]', result TEXT, updated_at REAL NOT NULL)"
    )
    conn.execute("INSERT INTO job (id, agent_id, updated_at) VALUES ('j', 'a', 0)")
    conn.commit()
    conn.close()
    store = SQLiteStore(db)
    await store.open()
    try:
        await store.claim("j", 1)
        await store.write_checkpoint("j", 1, "c1", 0, b"{}")
        other = SQLiteStore(db)
        await other.open()
        try:
            with pytest.raises(AttemptFenced, match="already claimed"):
                await other.claim("j", 1)
        finally:
            await other.close()
    finally:
        await store.close()


@pytest.mark.anyio
async def test_postgres_same_attempt_claims_second_loses(postgres_url: str) -> None:
    first, second = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await first.open()
    await first.init_schema()
    await second.open()
    try:
        await first.create_job("j", "a", None)
        results = []

        async def claim(store: PostgresStore) -> None:
            try:
                await store.claim("j", 1)
                results.append("won")
            except AttemptFenced as exc:
                results.append(str(exc))

        async with anyio.create_task_group() as tg:  # at the same moment: the row lock decides
            tg.start_soon(claim, first)
            tg.start_soon(claim, second)
        assert results.count("won") == 1, results
        assert "already claimed by a live process" in next(r for r in results if r != "won")
        winner, loser = (first, second) if await _owner(postgres_url) == first.owner else (second, first)
        await winner.write_checkpoint("j", 1, "c1", 0, b"{}")
        with pytest.raises(AttemptFenced):  # a token mismatch fences every write, not only the claim
            await loser.write_checkpoint("j", 1, "c2", 0, b"{}")
        with pytest.raises(AttemptFenced):
            await loser.heartbeat("j", 1)
        # A claim whose owner has exited (same host and pid namespace, pid gone) is taken over by the same
        # attempt.
        conn = await asyncpg.connect(postgres_url)
        try:
            host, namespace = winner.owner.split(":")[0], winner.owner.split(":")[-1]
            dead = f"{host}:999999999:1:dead:{namespace}"
            await conn.execute("UPDATE job SET owner = $1 WHERE id = 'j'", dead)
        finally:
            await conn.close()
        await loser.claim("j", 1)
        await loser.write_checkpoint("j", 1, "c3", 0, b"{}")
    finally:
        await first.close()
        await second.close()


@pytest.mark.anyio
async def test_postgres_table_without_owner_still_works_and_db_init_adds_it(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(
            "CREATE TABLE job (id text PRIMARY KEY, agent_id text NOT NULL, status text NOT NULL DEFAULT"
            " 'PENDING', payload jsonb, attempt integer NOT NULL DEFAULT 0, checkpoint bytea, checkpoint_crc"
            " bigint, checkpoint_id text, heartbeat_at timestamptz, tokens_consumed jsonb NOT NULL DEFAULT"
            " '{}', token_budget jsonb, error jsonb NOT NULL DEFAULT '[]', result jsonb,"
            " updated_at timestamptz NOT NULL DEFAULT now())"
        )
        await conn.execute(
            "CREATE TABLE checkpoint_history (job_id text NOT NULL, checkpoint_id text NOT NULL, step"
            " integer NOT NULL, checkpoint bytea NOT NULL, crc bigint NOT NULL, created_at timestamptz NOT"
            " NULL DEFAULT clock_timestamp(), PRIMARY KEY (job_id, checkpoint_id))"
        )
        # The durable conversation's table (0.2): a checkpoint writes its rows in the same statement.
        await conn.execute(
            "CREATE TABLE conversation (job_id text NOT NULL, seq integer NOT NULL, step integer NOT NULL,"
            " message bytea NOT NULL, PRIMARY KEY (job_id, seq))"
        )
        await conn.execute("INSERT INTO job (id, agent_id) VALUES ('j', 'a')")
        old = PostgresStore(postgres_url)
        await old.open()
        try:
            assert "no owner column" in caplog.text
            await old.claim("j", 1)  # attempt-only fencing, as before
            await old.write_checkpoint("j", 1, "c1", 0, b"{}")
            await old.heartbeat("j", 1)
            await old.init_schema()  # db init migrates
        finally:
            await old.close()
        columns = await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE column_name='owner'"
        )
        assert columns
    finally:
        await conn.close()


async def _owner(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval("SELECT owner FROM job WHERE id = 'j'"))
    finally:
        await conn.close()


# -- retries of side-effecting tools --------------------------------------------------------------------


def _flaky_agent(options: dict[str, Any], fail_times: int) -> tuple[AgentProcess, list[int]]:
    runs: list[int] = []

    @tool(**options)
    async def send(n: int) -> str:
        runs.append(n)
        if len(runs) <= fail_times:
            raise ConnectionError("connection reset by peer")
        return "sent"

    class Flaky(AgentProcess):
        agent_id = "flaky"

        async def step(self, ctx: StepContext) -> Done | None:
            await ctx.call_tool(send, n=1)
            return Done(result={"runs": len(runs)})

    return Flaky(), runs


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("options", "fail_times", "expected_runs", "exit_code"),
    [
        ({"side_effects": True}, 100, 1, 1),  # no verify: never retried in-process
        ({"side_effects": True, "retries": 2}, 100, 3, 1),
        ({"side_effects": True, "retries": 2}, 1, 2, 0),
        ({"side_effects": False}, 2, 3, 0),  # read-only: retried within the budgets
        ({"side_effects": False, "retries": 0}, 100, 1, 1),
    ],
)
async def test_side_effecting_tools_without_verify_run_once_unless_told(
    tmp_path: Path, options: dict[str, Any], fail_times: int, expected_runs: int, exit_code: int
) -> None:
    agent, runs = _flaky_agent(options, fail_times)
    result = await AgentHarness(tmp_path).run(agent)
    assert result.exit_code == exit_code
    assert len(runs) == expected_runs


def test_tool_retries_must_be_a_whole_number() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="retries"):
            tool(retries=bad)(lambda: None)  # type: ignore[arg-type]
