"""The console's jobs list pages by a keyset cursor: a page of a 100 000-row store against a 100-row one.

Metrics (ratios of medians, the same page read through the console's read path, ``_console._data.list_jobs``,
on two SQLite stores made in this run, then on two PostgreSQL databases of one server started by the run):

- ``console_first_page``: the newest 50 rows.
- ``console_deep_page``: the 50 rows after a cursor near the end (row 90 000 of 100 000; row 90 of 100).
- ``console_filtered_page``: the newest 50 FAILED rows of one agent, after a cursor.

Target: each <= 2x the 100-row store's (an OFFSET page would grow with the depth, by about 1000x here).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import emit

from agentlife._console._data import Cursors, ListQuery, list_jobs
from agentlife._jobs._mask import Masker
from agentlife._redact import Redactor
from agentlife.stores import CheckpointStore, SQLiteStore

REPS = 40
TARGET = 2.0


async def make_store(path: Path, rows: int) -> SQLiteStore:
    store = SQLiteStore(path)
    await store.open()
    await store.init_schema()
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at) VALUES (?, ?, ?, ?, 1, ?)",
        (
            (f"job-{n:06d}", f"agent-{n % 7}", "FAILED" if n % 10 == 0 else "COMPLETED", '{"n": 1}', 1e9 + n)
            for n in range(rows)
        ),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    store = SQLiteStore(path)
    await store.open()
    return store


async def timed(store: CheckpointStore, query: ListQuery) -> float:
    samples = []
    masker, cursors = Masker(Redactor()), Cursors()
    for _ in range(REPS):
        start = time.perf_counter()
        result = await list_jobs(store, query, masker, cursors)
        samples.append((time.perf_counter() - start) * 1000)
        assert len(result.rows) == 50, len(result.rows)
    return statistics.median(samples)


def queries(rows: int) -> dict[str, ListQuery]:
    """Pages that each hold a full 50 rows on both stores, so the two sides read the same amount."""
    if rows <= 100:  # the baseline: a cursor 40 rows down, a filter that most rows match
        return {
            "console_first_page": ListQuery(),
            "console_deep_page": ListQuery(after=(1e9 + 59, "job-000059")),
            "console_filtered_page": ListQuery(status="COMPLETED", after=(1e9 + 99, "job-000099")),
        }
    deep = rows // 10  # newest first: 90 % of the way down
    return {
        "console_first_page": ListQuery(),
        "console_deep_page": ListQuery(after=(1e9 + deep, f"job-{deep:06d}")),
        # One agent's FAILED rows (one row in 70), past a cursor 10 % of the way down.
        "console_filtered_page": ListQuery(status="FAILED", agent="agent-0", after=(1e9 + rows * 0.9, "")),
    }


async def make_pg_store(url: str, rows: int) -> CheckpointStore:
    import asyncpg  # type: ignore[import-untyped]

    from agentlife.stores import PostgresStore

    store = PostgresStore(url, listen=False)
    await store.open()
    await store.init_schema()
    conn = await asyncpg.connect(url)
    try:
        await conn.copy_records_to_table(
            "job",
            columns=["id", "agent_id", "status", "payload", "attempt", "updated_at"],
            records=[
                (
                    f"job-{n:06d}",
                    f"agent-{n % 7}",
                    "FAILED" if n % 10 == 0 else "COMPLETED",
                    '{"n": 1}',
                    1,
                    dt.datetime.fromtimestamp(1e9 + n, dt.UTC),
                )
                for n in range(rows)
            ],
        )
        await conn.execute("ANALYZE job")
    finally:
        await conn.close()
    return store


async def compare(small: CheckpointStore, big: CheckpointStore, prefix: str) -> None:
    for (name, q_small), q_big in zip(queries(100).items(), queries(100_000).values(), strict=True):
        base = await timed(small, q_small)
        value = await timed(big, q_big)
        emit(
            "console",
            f"{prefix}{name}",
            value,
            "ms",
            baseline=base,
            target=f"<= {TARGET}x the 100-row store",
            ok=value <= base * TARGET,
        )


async def main(pg: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        small = await make_store(Path(tmp) / "small.db", 100)
        big = await make_store(Path(tmp) / "big.db", 100_000)
        try:
            await compare(small, big, "")
        finally:
            await small.close()
            await big.close()
    small = await make_pg_store(pg.create_database("console_small"), 100)
    big = await make_pg_store(pg.create_database("console_big"), 100_000)
    try:
        await compare(small, big, "postgresql_")
    finally:
        await small.close()
        await big.close()


if __name__ == "__main__":
    from _pg import running_postgres

    with running_postgres() as server:
        anyio.run(main, server)
