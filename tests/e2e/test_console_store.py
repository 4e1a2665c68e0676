"""The store the console reads is the one at its configured path or URL, now, never a stale copy.

With real console processes: a SQLite file deleted while the console runs is the documented error page
(503, ``no store at``) and a new store made at the path is read; a file replaced by another (a restored
backup) is read, and an approval made from the page lands in the store that operators and workers read,
never in the deleted file the console's connection held. An action whose write raced a replacement is
not acknowledged (the race is held still in-process, where it can be). A PostgreSQL database dropped
while the console runs answers 503 with one line in the log, no traceback, and is read again once it is
back.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest

from _pg import PostgresServer
from agentlife.stores import ApprovalRequest, store_from_url
from consoles import TOKEN, request, start_console, stop
from procs import agent_env, cli_in_process


def _remove_store(db: Path) -> None:
    """What an operator does to take a SQLite store away: the file and its WAL and shared-memory files."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def _parked_store(db: Path, job_id: str) -> None:
    """A store at ``db`` holding ``job_id`` parked on an approval of call ``{job_id}/0/1``."""
    url = f"sqlite:///{db}"

    async def park() -> None:
        store = store_from_url(url)
        await store.open()  # makes the file and its tables, as `db init` does
        try:
            await store.create_job(job_id, "deployer", {})
            await store.claim(job_id, 1)
            await store.request_approval(job_id, 1, ApprovalRequest(f"{job_id}/0/1", "d1", "deploy", 0, 1))
        finally:
            await store.close()

    anyio.run(park)


def _status(env: dict[str, str], job_id: str) -> str:
    shown = cli_in_process("job", "list", "--json", env=env)
    rows = {r["id"]: r for r in map(orjson.loads, shown.stdout.splitlines())}
    return str(rows[job_id]["status"])


@pytest.fixture
def sqlite_env(tmp_path: Path) -> dict[str, str]:
    return agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=f"sqlite:///{tmp_path / 'agentlife.db'}")


def test_a_deleted_store_file_is_the_error_page_and_a_new_one_at_the_path_is_read(
    tmp_path: Path, sqlite_env: dict[str, str]
) -> None:
    db = tmp_path / "agentlife.db"
    assert cli_in_process("db", "init", env=sqlite_env).returncode == 0
    assert cli_in_process("job", "create", "demo", "--id", "job-old", env=sqlite_env).returncode == 0
    proc, url = start_console(sqlite_env)
    try:
        assert "job-old" in request(url)[1]
        _remove_store(db)
        status, body, _ = request(url)
        assert status == 503 and "no store at" in body and "job-old" not in body
        assert request(url + "job?id=job-old")[0] == 503
        assert not db.exists()  # the console never makes a store
        assert cli_in_process("db", "init", env=sqlite_env).returncode == 0
        assert cli_in_process("job", "create", "demo", "--id", "job-new", env=sqlite_env).returncode == 0
        status, body, _ = request(url)
        assert status == 200 and "job-new" in body and "job-old" not in body
    finally:
        err = stop(proc)
    assert "Traceback" not in err


def test_an_approval_lands_in_the_store_at_the_path_after_the_file_was_replaced(
    tmp_path: Path, sqlite_env: dict[str, str]
) -> None:
    db = tmp_path / "agentlife.db"
    _parked_store(db, "park")
    backup = tmp_path / "backup" / "agentlife.db"
    backup.parent.mkdir()
    _parked_store(backup, "park")
    proc, url = start_console({**sqlite_env, "AGENTLIFE_CONSOLE_TOKEN": TOKEN}, "--allow-actions")
    try:
        assert 'value="park/0/1"' in request(url + "job?id=park")[1]  # the console holds the file open
        _remove_store(db)  # a backup restored over it
        shutil.copyfile(backup, db)
        form = {"id": "park", "action": "approve", "call": "park/0/1", "token": TOKEN}
        status, _, headers = request(url + "job/action", form)
        assert status == 303, status
        # The store every operator and worker reads recorded it: not only a file no one can open any more.
        assert _status(sqlite_env, "park") != "WAITING_FOR_APPROVAL"
        page = request(url + headers["Location"].lstrip("/"))[1]
        assert "Approved" in page and 'value="park/0/1"' not in page
    finally:
        stop(proc)


# -- PostgreSQL -------------------------------------------------------------------------------------------


@pytest.fixture
def scratch_database(postgres_server: PostgresServer) -> Iterator[tuple[str, str]]:
    url = postgres_server.create_database("console")
    name = url.rsplit("/", 1)[1]
    yield url, name
    postgres_server.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_dropped_database_is_a_503_with_one_log_line_and_is_read_again_once_back(
    tmp_path: Path, postgres_server: PostgresServer, scratch_database: tuple[str, str]
) -> None:
    url, name = scratch_database
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=url)
    assert cli_in_process("db", "init", env=env).returncode == 0
    assert cli_in_process("job", "create", "demo", "--id", "pg-job", env=env).returncode == 0
    proc, console = start_console(env)
    try:
        assert request(console)[0] == 200
        postgres_server.execute(f"DROP DATABASE {name} WITH (FORCE)")
        answers = [request(console + path) for path in ("", "job?id=pg-job", "job/state?id=pg-job", "")]
        assert [status for status, _, _ in answers] == [503, 503, 503, 503]
        assert all("Store Unavailable" in body or "store" in body for _, body, _ in answers)
        postgres_server.execute(f"CREATE DATABASE {name}")
        assert cli_in_process("db", "init", env=env).returncode == 0
        assert cli_in_process("job", "create", "demo", "--id", "pg-back", env=env).returncode == 0
        status, body, _ = request(console)
        assert status == 200 and "pg-back" in body
    finally:
        err = stop(proc)
    assert "Traceback" not in err and "asyncpg" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and all("console: the store failed" in line for line in lines), err
    assert postgres_server.password not in err
