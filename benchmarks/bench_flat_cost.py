"""Cost that stays flat as the tables grow: the hot reads on 1 000 000 finished rows against an empty table.

Two databases of one real PostgreSQL server started by the run (``running_postgres``, fsync off): one whose
job table holds ``FLAT_FINISHED`` finished rows (default 1 000 000, COMPLETED / FAILED / CANCELLED over five
agents) and ``FLAT_WAITING`` rows parked at a durable wait not due for a day (default 100 000, a fifth of them
of the claiming agent), filled with ``INSERT ... SELECT generate_series`` and analysed; one whose job table
is empty. Each operation runs on the two alternately, ``FLAT_REPS`` times (default 300) after a warm-up;
the figure is the median on the big table, the baseline the median on the empty one (p99s are printed and
kept in the result line, but on a shared 2-core machine a tail is the neighbours' as much as ours):

- ``claim of an agent, nothing due``: `PostgresStore.claim_next` for an agent none of whose rows is due
  (on the big table its 20 000 parked waits and 200 000 finished rows). Target <= 1.2x.
- ``claim of an agent, one row due``: the same with one PENDING row of the agent; the claimed row is put
  back (untimed) after each claim. Target <= 1.2x.
- ``job list first page``: `agentlife.Client.list` (what ``job list`` prints), 50 rows. Target <= 1.2x
  (the baseline's page is the 50 newest rows too: each side holds a full page of finished rows).
- ``console first page``: the console's jobs list as its HTTP handler reads it
  (``_console._data.list_jobs``: the page read and every row masked), 50 rows. Target <= 1.2x.

To keep the pages comparable, the "empty" database holds 60 finished rows: a page has the same 50 rows to
read and mask on both sides, and nothing else. The fill takes about a minute on the 2-core machine that
measured docs/performance.md; ``FLAT_FINISHED=200000`` runs in seconds.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import emit

from _pg import running_postgres
from agentlife import Client
from agentlife._console._data import Cursors, ListQuery, list_jobs
from agentlife._jobs._mask import Masker
from agentlife._redact import Redactor
from agentlife.stores import PostgresStore

FINISHED = int(os.environ.get("FLAT_FINISHED", "1000000"))
WAITING = int(os.environ.get("FLAT_WAITING", "100000"))
REPS = int(os.environ.get("FLAT_REPS", "300"))
WARMUP = 30
TARGET = 1.2
AGENT = "agent-0"


async def fill(url: str, finished: int, waiting: int) -> float:
    """Fill the job table; returns the seconds it took."""
    import asyncpg  # type: ignore[import-untyped]

    started = time.monotonic()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at, not_before)"
            " SELECT 'done-' || lpad(i::text, 7, '0'), 'agent-' || (i % 5),"
            " (ARRAY['COMPLETED', 'COMPLETED', 'COMPLETED', 'FAILED', 'CANCELLED'])[1 + i % 5],"
            ' \'{"prompt": "a finished job"}\'::jsonb, 1,'
            " now() - interval '1 hour' - i * interval '1 second', now() - i * interval '1 second'"
            " FROM generate_series(1, $1) AS i",
            finished,
        )
        await conn.execute(
            "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at, not_before, waiting)"
            " SELECT 'wait-' || lpad(i::text, 7, '0'), 'agent-' || (i % 5), 'WAITING', '{}'::jsonb, 1,"
            " now() - interval '2 hours', now() + interval '1 day' + i * interval '1 second',"
            ' \'{"kind": "sleep"}\'::jsonb FROM generate_series(1, $1) AS i',
            waiting,
        )
        await conn.execute("VACUUM ANALYZE job")
    finally:
        await conn.close()
    return time.monotonic() - started


class Side:
    """One database: its store, a client, the console's helpers and a bare connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.store = PostgresStore(url, max_size=2, listen=False)
        self.client: Client | None = None
        self.conn: Any = None
        self.masker = Masker(Redactor())
        self.cursors = Cursors()

    async def open(self) -> None:
        import asyncpg

        await self.store.open()
        self.client = await Client.connect(self.url)
        self.conn = await asyncpg.connect(self.url)

    async def close(self) -> None:
        await self.conn.close()
        assert self.client is not None
        await self.client.close()
        await self.store.close()

    async def claim_idle(self) -> None:
        assert await self.store.claim_next(AGENT) is None

    async def claim_due(self) -> None:
        claimed = await self.store.claim_next(AGENT)
        assert claimed is not None and claimed.id == "due-1", claimed

    async def put_back(self) -> None:
        await self.conn.execute("UPDATE job SET status = 'PENDING', owner = NULL WHERE id = 'due-1'")

    async def job_list(self) -> None:
        assert self.client is not None
        page = await self.client.list()
        assert len(page.jobs) == 50, len(page.jobs)

    async def console_page(self) -> None:
        result = await list_jobs(self.store, ListQuery(), self.masker, self.cursors)
        assert len(result.rows) == 50, len(result.rows)


async def timed(
    sides: tuple[Side, Side],
    op: Callable[[Side], Awaitable[None]],
    after: Callable[[Side], Awaitable[None]] | None,
) -> tuple[list[float], list[float]]:
    samples: tuple[list[float], list[float]] = ([], [])
    for i in range(WARMUP + REPS):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for k in order:
            start = time.perf_counter()
            await op(sides[k])
            elapsed = (time.perf_counter() - start) * 1000
            if after is not None:
                await after(sides[k])
            if i >= WARMUP:
                samples[k].append(elapsed)
    return samples


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * len(ordered)) - 1)]


async def main(pg: Any) -> None:
    urls = (pg.create_database("flat_empty"), pg.create_database("flat_big"))
    for url in urls:
        store = PostgresStore(url, listen=False)
        await store.open()
        await store.init_schema()
        await store.close()
    await fill(urls[0], 60, 0)
    seconds = await fill(urls[1], FINISHED, WAITING)
    scale = f"{FINISHED:,} finished + {WAITING:,} waiting rows"
    print(f"filled {scale} in {seconds:.1f} s", flush=True)
    sides = (Side(urls[0]), Side(urls[1]))
    for side in sides:
        await side.open()
    try:
        plan = await sides[1].conn.fetch(
            "EXPLAIN SELECT id FROM job WHERE agent_id = $1 AND status IN ('PENDING', 'RETRYING', 'WAITING')"
            " AND (not_before IS NULL OR not_before <= now()) LIMIT 1",
            AGENT,
        )
        print("a due-row read on the big table: " + " / ".join(r[0].strip() for r in plan), flush=True)
        ops: list[tuple[str, Callable[[Side], Awaitable[None]], Callable[[Side], Awaitable[None]] | None]] = [
            ("claim of an agent, nothing due", Side.claim_idle, None),
            ("claim of an agent, one row due", Side.claim_due, Side.put_back),
            ("job list first page (Client.list)", Side.job_list, None),
            ("console first page (its list read, masked)", Side.console_page, None),
        ]
        for name, op, after in ops:
            if after is Side.put_back:
                for side in sides:
                    await side.conn.execute(
                        "INSERT INTO job (id, agent_id, status, payload, attempt, updated_at, not_before)"
                        " VALUES ('due-1', $1, 'PENDING', '{}'::jsonb, 0, now(), now() - interval '1 s')",
                        AGENT,
                    )
            empty, big = await timed(sides, op, after)
            value, base = statistics.median(big), statistics.median(empty)
            emit(
                "flat_cost",
                f"{name}: {scale} vs none, p50",
                value,
                "ms",
                baseline=base,
                target=f"<= {TARGET:g}x the empty table",
                ok=value <= TARGET * base,
                p99_ms=round(p99(big), 3),
                p99_baseline_ms=round(p99(empty), 3),
                finished_rows=FINISHED,
                waiting_rows=WAITING,
                fill_seconds=round(seconds, 1),
            )
            if after is Side.put_back:
                for side in sides:
                    await side.conn.execute("DELETE FROM job WHERE id = 'due-1'")
    finally:
        for side in sides:
            await side.close()


if __name__ == "__main__":
    with running_postgres(fast=True) as server:
        anyio.run(main, server)
