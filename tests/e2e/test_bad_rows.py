"""Job rows written by someone else, that agentlife cannot read: one of them never stops a pool or the CLI.

A payload that is not JSON (SQLite keeps any bytes) or that no float holds (``1e400`` is valid jsonb on
PostgreSQL): real ``python -m agentlife worker`` processes set the row aside as DEAD_LETTER with the reason
in its crash history and go on to the next job; ``job list``, ``show`` and ``cancel`` work on it; ``run``
refuses it at boot. A job whose boot fails in a worker (an id no path may hold, written by hand) becomes a
crash record and the crash policy dead-letters it instead of retrying it for ever.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_worker import AGENT, create_jobs, finish, rows, spawn_worker, worker_env

from agentlife.stores import JobStatus, store_from_url
from procs import agent_env, cli_in_process, json_lines, run_cli

#: What each backend can hold that agentlife cannot read, as the SQL that writes it.
BAD_PAYLOAD = {
    # Not UTF-8, not JSON: sqlite3 would raise on fetching it as text.
    "sqlite": ("UPDATE job SET payload = X'7bff6e6f74206a736f6e', not_before = 0 WHERE id = $1", "not JSON"),
    # Valid jsonb (PostgreSQL's numeric keeps it), but no double holds it.
    "postgresql": (
        "UPDATE job SET payload = '{\"n\": 1e400}'::jsonb, not_before = now() - interval '1 hour'"
        " WHERE id = $1",
        "number is infinity",
    ),
}


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return "sqlite", f"sqlite:///{tmp_path / 'agentlife.db'}"
    return "postgresql", str(request.getfixturevalue("postgres_url"))


def sql(url: str, statement: str, *args: Any) -> None:
    """One statement from another client (SQLite's ``?`` written as ``$n`` like PostgreSQL's)."""
    if url.startswith("sqlite"):
        for n in range(len(args), 0, -1):
            statement = statement.replace(f"${n}", "?")
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            conn.execute(statement, args)
        finally:
            conn.close()
        return

    async def go() -> None:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.execute(statement, *args)
        finally:
            await conn.close()

    anyio.run(go)


def spoil_payload(kind: str, url: str, job_id: str) -> str:
    statement, reason = BAD_PAYLOAD[kind]
    sql(url, statement, job_id)
    return reason


# -- a worker --------------------------------------------------------------------------------------------


def test_a_worker_sets_a_row_it_cannot_read_aside_and_runs_the_next_job(
    tmp_path: Path, db: tuple[str, str]
) -> None:
    kind, url = db
    create_jobs(url, "bad", "good")
    reason = spoil_payload(kind, url, "bad")  # and made the oldest runnable row: claimed first
    code, out = finish(spawn_worker(worker_env(tmp_path, url), "--max-jobs", "1"))
    assert code == 0, out
    assert "Traceback" not in out and "internal error" not in out
    final = rows(url)
    assert final["good"].status == JobStatus.COMPLETED
    bad = final["bad"]
    assert bad.status == JobStatus.DEAD_LETTER
    (entry,) = bad.error
    assert entry["error_class"] == "UnreadableRow" and entry["decision"] == "DEAD_LETTER"
    assert "payload" in entry["message"] and reason in entry["message"]
    # Not a crash: it counts toward no retry limit and no circuit breaker.
    assert "exit_code" not in entry
    aside = [line for line in json_lines(out) if line.get("event") == "set_aside"]
    assert [line["job_id"] for line in aside] == ["bad"]
    assert "job retry bad" in str(aside[0]["msg"])


def test_a_crash_history_that_does_not_decode_is_kept_when_the_row_is_set_aside(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    create_jobs(url, "bad")
    sql(url, "UPDATE job SET error = '{torn', not_before = 0 WHERE id = 'bad'")
    code, out = finish(spawn_worker(worker_env(tmp_path, url), "--idle-timeout", "0.5"))
    assert code == 0, out
    bad = rows(url)["bad"]
    assert bad.status == JobStatus.DEAD_LETTER
    kept, aside = bad.error
    assert (kept["event"], kept["raw"]) == ("unreadable_history", "{torn")
    assert aside["error_class"] == "UnreadableRow" and "error: not JSON" in aside["message"]


def test_a_table_of_unreadable_rows_is_set_aside_in_bounded_claims(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    ids = [f"bad-{i:02d}" for i in range(40)]  # more than one claim sets aside
    create_jobs(url, *ids, "good")
    for job_id in ids:
        spoil_payload("sqlite", url, job_id)
    code, out = finish(spawn_worker(worker_env(tmp_path, url), "--max-jobs", "1"))
    assert code == 0, out
    final = rows(url)
    assert final["good"].status == JobStatus.COMPLETED
    assert {final[i].status for i in ids} == {JobStatus.DEAD_LETTER}


def test_a_job_whose_boot_fails_in_a_worker_is_dead_lettered_by_the_crash_policy(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    create_jobs(url, "good")
    # `job create` refuses this id; another client wrote it. No path may be built from it.
    sql(url, "INSERT INTO job (id, agent_id, status, attempt, updated_at, not_before) VALUES"
        " ('../escape', $1, 'PENDING', 0, 0, 0)", AGENT)  # fmt: skip
    # Scaled x 0.01: the crash backoff 5 s, 60 s is 0.05 s, 0.6 s.
    code, out = finish(spawn_worker(worker_env(tmp_path, url), "--idle-timeout", "2", "--time-scale", "0.01"))
    assert code == 0, out
    final = rows(url)
    assert final["good"].status == JobStatus.COMPLETED
    escape = final["../escape"]
    assert (escape.status, escape.attempt) == (JobStatus.DEAD_LETTER, 3)
    assert [(e["error_class"], e["attempt"], e["exit_code"]) for e in escape.error] == [
        ("BootFailure", 1, 1),
        ("BootFailure", 2, 1),
        ("BootFailure", 3, 1),
    ]
    assert "job id '../escape' is not allowed" in escape.error[0]["message"]
    decisions = [str(line["msg"]) for line in json_lines(out) if "job ../escape crashed" in str(line["msg"])]
    assert [d.split(" (")[0] for d in decisions] == [
        "job ../escape crashed: RETRYING in 0.05s",
        "job ../escape crashed: RETRYING in 0.6s",
        "job ../escape crashed: DEAD_LETTER",
    ]
    assert not (tmp_path / "escape").exists() and not (tmp_path / "data" / "escape").exists()


# -- the command line ------------------------------------------------------------------------------------


def test_job_list_show_and_cancel_work_on_a_row_the_store_cannot_read(
    tmp_path: Path, db: tuple[str, str]
) -> None:
    kind, url = db
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url)
    create_jobs(url, "bad", "fine")
    reason = spoil_payload(kind, url, "bad")

    listed = cli_in_process("job", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    by_id = {row["id"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert set(by_id) == {"bad", "fine"}
    assert by_id["bad"]["payload"] is None and reason in by_id["bad"]["unreadable"]["payload"]
    assert by_id["fine"]["unreadable"] == {}
    table = cli_in_process("job", "list", env=env)
    assert table.returncode == 0 and "bad " in table.stdout, table.stderr

    shown = cli_in_process("job", "show", "bad", env=env)
    assert shown.returncode == 0, shown.stderr
    payload_line = next(line for line in shown.stdout.splitlines() if line.strip().startswith("payload"))
    assert "(unreadable: " in payload_line and reason in payload_line

    cancelled = cli_in_process("job", "cancel", "bad", "--reason", "bad row", env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    row = rows(url)["bad"]
    assert row.status == JobStatus.FAILED and row.error[-1]["message"] == "bad row"
    assert rows(url)["fine"].status == JobStatus.PENDING


def test_run_refuses_a_job_row_it_cannot_read_at_boot(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    create_jobs(url, "bad")
    spoil_payload("sqlite", url, "bad")
    env = worker_env(tmp_path, url, AGENTLIFE_JOB_ID="bad")
    done = run_cli("run", "agents.worker_agent:WorkerAgent", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    fatal = [line for line in json_lines(done.stdout) if line.get("level") == "ERROR"]
    assert "the job row cannot be read: payload: not JSON" in str(fatal[0]["msg"])
    assert not (tmp_path / "traces" / "steps").exists()  # no step ran on a guessed payload


def test_the_reaper_reads_past_a_history_it_cannot_decode(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    create_jobs(url, "torn", "zombie")
    sql(url, "UPDATE job SET error = 'not json', status = 'FAILED', updated_at = $1 WHERE id = 'torn'", 1e12)

    async def claim() -> None:
        store = store_from_url(url)
        await store.open()
        try:
            await store.claim("zombie", 1)
        finally:
            await store.close()

    anyio.run(claim)
    sql(url, "UPDATE job SET heartbeat_at = 0, owner = NULL WHERE id = 'zombie'")
    reaped = run_cli("reap", env=agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url))
    assert reaped.returncode == 0, reaped.stderr
    assert reaped.stdout.splitlines()[-1] == "reaped 1 job (threshold 300 s)"
    assert rows(url)["zombie"].status == JobStatus.RETRYING


@pytest.mark.parametrize(("as_text", "bad_hex"), [(False, "626164FF"), (True, "626164FF"), (False, "626164")])
def test_a_sqlite_row_whose_id_is_not_utf8_text_is_set_aside_and_the_pool_goes_on(
    tmp_path: Path, as_text: bool, bad_hex: str
) -> None:
    # Another client inserted rows whose id is a BLOB, or text that is not UTF-8: sqlite3 raises on
    # fetching it as text, and no ``WHERE id = ?`` can find a BLOB. One is the oldest runnable row, the
    # other a RUNNING row whose heartbeat stopped long ago (the reaper's business).
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    create_jobs(url, "good")

    def bad_id(suffix: str) -> str:
        return f"CAST(X'{bad_hex}{suffix}' AS TEXT)" if as_text else f"X'{bad_hex}{suffix}'"

    db = sqlite3.connect(tmp_path / "agentlife.db", isolation_level=None)
    try:
        columns = [r[1] for r in db.execute("PRAGMA table_info(job)")]
        runnable = ", ".join("not_before - 100" if c == "not_before" else c for c in columns[1:])
        stale = ", ".join({"status": "'RUNNING'", "heartbeat_at": "0"}.get(c, c) for c in columns[1:])
        for id_sql, rest in ((bad_id(""), runnable), (bad_id("21"), stale)):
            db.execute(
                f"INSERT INTO job ({', '.join(columns)}) SELECT {id_sql}, {rest} FROM job WHERE id = 'good'"
            )
    finally:
        db.close()
    env = worker_env(tmp_path, url)
    reaped = run_cli("reap", "--database-url", url, env=env)
    assert reaped.returncode == 0, reaped.stderr
    code, out = finish(spawn_worker(env, "--max-jobs", "1"))
    assert code == 0, out
    assert "Traceback" not in out and "internal error" not in out
    listed = cli_in_process("job", "list", "--database-url", url, env=env)
    assert listed.returncode == 0, listed.stderr
    statuses = sorted(line.split()[2] for line in listed.stdout.splitlines()[1:])
    assert statuses == ["COMPLETED", "DEAD_LETTER", "RUNNING"]  # the stale one is the operator's to mend
