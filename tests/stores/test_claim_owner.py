"""The claim's owner column: migrated into an old SQLite database, added by ``db init`` on
PostgreSQL, and a second claim with the same attempt losing on a real PostgreSQL server.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import asyncpg
import pytest

from agentlife import AttemptFenced
from agentlife.stores import PostgresStore, SQLiteStore

# -- two live processes, one attempt ----------------------------------------------------------------------


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
