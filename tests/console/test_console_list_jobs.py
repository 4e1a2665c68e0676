"""The console over HTTP, with real processes: what it refuses (actions without the token, from another
origin, in the wrong order), what it never shows (secrets, markup), what it does with hostile requests and
a store that is not there, and the keyset paging it reads through (both stores)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentlife.stores import JobRecord, store_from_url
from consoles import TOKEN, start_console, stop
from procs import agent_env, cli_in_process


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    db = tmp_path / "agentlife.db"
    env = agent_env(tmp_path / "data", AGENTLIFE_DATABASE_URL=f"sqlite:///{db}")
    assert cli_in_process("db", "init", env=env).returncode == 0
    return env


@pytest.fixture
def console(store_env: dict[str, str]) -> Iterator[str]:
    proc, url = start_console({**store_env, "AGENTLIFE_CONSOLE_TOKEN": TOKEN}, "--allow-actions")
    yield url
    err = stop(proc)
    assert TOKEN not in err


# -- keyset paging, on both stores ------------------------------------------------------------------------


def test_list_jobs_pages_by_cursor_without_skipping_or_repeating_ties(db_url: str) -> None:
    async def go() -> None:
        store = store_from_url(db_url)
        await store.open()
        try:
            await store.init_schema()
            for n in range(23):
                await store.create_job(f"page-{n:02d}", "pager" if n % 2 else "other", {"n": n})
            rows = await store.list_jobs(limit=1000)
            ids = [r.id for r in rows if r.id.startswith("page-")]
            seen: list[str] = []
            after = None
            while True:
                page = await store.list_jobs(None, None, 5, after=after)
                page = [r for r in page if r.id.startswith("page-")]
                if not page:
                    break
                seen += [r.id for r in page]
                last = page[-1]
                assert last.updated_at is not None
                after = (last.updated_at, last.id)
            assert seen == ids and len(set(seen)) == 23
            filtered = await store.list_jobs(None, "pager", 100, after=None)
            assert [r.id for r in filtered] == [i for i in ids if int(i[-2:]) % 2]
        finally:
            await store.close()

    anyio.run(go)


#: More rows than one page of the console (50), most of them sharing one ``updated_at`` (a bulk insert).
TIED = 40
LONG_ID = "L" * 2999


def _plant_awkward_rows(url: str) -> None:
    """Rows another client wrote: ids the stores read and set aside, times at the edges, long ids, ties."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        tie = time.time()
        try:
            rows: list[tuple[Any, Any]] = [(f"tie-{n:02d}", tie) for n in range(TIED)]
            rows += [
                (b"job-1", tie),  # a BLOB id with the bytes of a text id that also exists
                ("job-1", tie),
                (b"\x00\xff\x01", tie),
                (None, tie),  # SQLite's PRIMARY KEY lets a NULL in
                (LONG_ID, tie),
                (LONG_ID + "M", tie),
                ("text-time", "not a number"),  # a REAL column holding text
                ("older", tie - 10),
            ]
            for job_id, at in rows:
                conn.execute(
                    "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at)"
                    " VALUES (?, 'bulk', 'PENDING', '{}', 0, ?)",
                    (job_id, at),
                )
            for raw in (b"\xff\x41", b"tie-\xff", b"tie-\xc3"):  # text that is not UTF-8
                conn.execute(
                    "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at)"
                    " VALUES (CAST(? AS TEXT), 'bulk', 'PENDING', '{}', 0, ?)",
                    (raw, tie),
                )
        finally:
            conn.close()
        return

    async def write() -> None:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            ids = [f"tie-{n:02d}" for n in range(TIED)] + ["ü-1", "😀-2", "Z", "a b", LONG_ID, LONG_ID + "M"]
            await conn.execute(  # one statement: one now() for every row, a tie of them all
                "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at)"
                " SELECT unnest($1::text[]), 'bulk', 'PENDING', '{}', 0, now()",
                ids,
            )
            for n in range(6):  # parked for ever, or since before time, by another client
                at = "infinity" if n % 2 else "-infinity"
                await conn.execute(
                    "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at)"
                    f" VALUES ($1, 'bulk', 'PENDING', '{{}}', 0, '{at}')",
                    f"edge-{n}",
                )
        finally:
            await conn.close()

    anyio.run(write)


def _identity(row: JobRecord) -> Any:
    return row.key if row.key is not None else row.id


def test_list_jobs_pages_every_row_once_over_ids_and_times_another_client_wrote(db_url: str) -> None:
    async def go() -> None:
        store = store_from_url(db_url)
        await store.open()
        try:
            await store.init_schema()
            _plant_awkward_rows_in_thread(db_url)
            everything = [_identity(r) for r in await store.list_jobs(limit=10_000)]
            seen: list[Any] = []
            after = None
            for _ in range(len(everything) + 2):  # a cursor that repeats a row would loop for ever
                page = await store.list_jobs(None, None, 7, after=after)
                if not page:
                    break
                seen += [_identity(r) for r in page]
                after = (page[-1].updated_at, _identity(page[-1]))
            assert seen == everything
            assert len(everything) > TIED + 5
        finally:
            await store.close()

    anyio.run(go)


def _plant_awkward_rows_in_thread(url: str) -> None:
    """`_plant_awkward_rows` from inside a running event loop (it runs its own)."""
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            _plant_awkward_rows(url)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
