"""Making a new SQLite store: the schema in one transaction, and several processes making one file at once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from agentlife.stores import SQLiteStore

pytestmark = pytest.mark.anyio


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


async def test_a_new_store_gets_the_same_schema_as_one_opened_again(tmp_path: Path) -> None:
    path = tmp_path / "agentlife.db"
    store = SQLiteStore(path)
    await store.open()
    await store.close()
    made = _tables(path)
    with sqlite3.connect(path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(job)")]
    assert "job" in made and {"owner", "not_before", "approval", "waiting"} <= set(columns)
    again = SQLiteStore(path)  # the existing file: no transaction, every statement a no-op
    await again.open()
    assert await again.get_job("missing") is None
    await again.close()
    assert _tables(path) == made


async def test_a_new_store_opened_in_threads_at_once_is_made_once(tmp_path: Path) -> None:
    path = tmp_path / "agentlife.db"
    stores = [SQLiteStore(path) for _ in range(4)]
    async with anyio.create_task_group() as tasks:
        for store in stores:
            tasks.start_soon(store.open)
    for i, store in enumerate(stores):
        await store.create_job(f"job-{i}", "agent", None)
    assert [(await stores[0].get_job(f"job-{i}")) is not None for i in range(4)] == [True] * 4
    for store in stores:
        await store.close()
