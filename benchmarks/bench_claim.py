"""Claim latency of `PostgresStore.claim_next` with 10 000 runnable rows against 10, on a real PostgreSQL.

Metric (one JSON object per line):

- ``pg_claim_next_p99_10k_vs_10``: p99 of ``claim_next()`` on a job table holding 10 000 runnable
  rows, against the same on a table holding 10, claims on the two databases interleaved in the same run.
  Target <= 1.5x: the claim walks the partial index on ``not_before`` and stops at the first row it can
  lock, so the table's size must not show. Each claimed row is put back (untimed) at the end of the queue,
  so both tables keep their size for the whole run.

- ``pg_claim_next_p99_10k_sleeping_vs_0``: p99 of ``claim_next()`` on a table holding 10 runnable rows and
  10 000 jobs parked at a durable wait (WAITING, ``not_before`` in the future), against the same table
  without them. Target <= 1.2x: the waiting rows sit in the same partial index after every due row, so the
  claim never reads them.

A note line prints the claim's plan on the big table, so a regression to a sequential scan is visible.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _pg import running_postgres
from agentlife.stores import PostgresStore

WARMUP = 30
TARGET = 1.5
SLEEPING_TARGET = 1.2


def emit(metric: str, value: float, unit: str, baseline: float, target: str, passed: bool) -> None:
    print(
        json.dumps(
            {
                "bench": "claim",
                "metric": metric,
                "value": round(value, 4),
                "unit": unit,
                "baseline": round(baseline, 4),
                "ratio": round(value / baseline, 3) if baseline else None,
                "target": target,
                "pass": passed,
            }
        ),
        flush=True,
    )


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def filled(url: str, rows: int, sleeping: int = 0) -> tuple[PostgresStore, object]:
    """A store on ``url`` whose job table holds ``rows`` runnable rows and ``sleeping`` WAITING ones not due
    for an hour or more (and a bare connection to it)."""
    import asyncpg

    store = PostgresStore(url, max_size=2)
    await store.open()
    await store.init_schema()
    conn = await asyncpg.connect(url)
    # Oldest first, a second apart; plus as many finished rows, which the partial index leaves out.
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, updated_at, not_before)"
        " SELECT 'job-' || i, 'agent-' || (i % 4), 'PENDING', '{}'::jsonb, now(),"
        " now() - make_interval(secs => $1 - i) FROM generate_series(1, $1) AS i",
        rows,
    )
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, updated_at, not_before)"
        " SELECT 'done-' || i, 'agent-0', 'COMPLETED', '{}'::jsonb, now(), now()"
        " FROM generate_series(1, $1) AS i",
        rows,
    )
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, updated_at, not_before, waiting)"
        " SELECT 'sleeping-' || i, 'agent-' || (i % 4), 'WAITING', '{}'::jsonb, now(),"
        ' now() + make_interval(secs => 3600 + i), \'{"kind": "sleep"}\'::jsonb'
        " FROM generate_series(1, $1) AS i",
        sleeping,
    )
    await conn.execute("ANALYZE job")
    return store, conn


async def bench(small_url: str, big_url: str, sleeping_url: str, n: int) -> None:
    small, small_conn = await filled(small_url, 10)
    big, big_conn = await filled(big_url, 10_000)
    sleeping, sleeping_conn = await filled(sleeping_url, 10, sleeping=10_000)
    requeue = "UPDATE job SET status = 'PENDING', not_before = now() WHERE id = $1"
    stores = {"small": (small, small_conn), "big": (big, big_conn), "sleeping": (sleeping, sleeping_conn)}
    try:
        plan = await big_conn.fetch(  # type: ignore[attr-defined]
            "EXPLAIN SELECT id FROM job WHERE status IN ('PENDING', 'RETRYING')"
            " AND (not_before IS NULL OR not_before <= now())"
            " ORDER BY not_before NULLS FIRST, id LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        print("plan on 10 000 rows: " + " / ".join(row[0].strip() for row in plan), flush=True)
        samples: dict[str, list[float]] = {"small": [], "big": [], "sleeping": []}
        gc.disable()
        try:
            for i in range(WARMUP + n):
                order = ("small", "big", "sleeping")
                for name in order if i % 2 == 0 else order[::-1]:
                    store, conn = stores[name]
                    start = time.perf_counter()
                    claimed = await store.claim_next()
                    elapsed = (time.perf_counter() - start) * 1000
                    assert claimed is not None
                    await conn.execute(requeue, claimed.id)  # type: ignore[attr-defined]
                    if i >= WARMUP:
                        samples[name].append(elapsed)
        finally:
            gc.enable()
        p99_big, p99_small = pct(samples["big"], 0.99), pct(samples["small"], 0.99)
        print(
            f"claim_next p50: {statistics.median(samples['big']):.3f} ms (10 000 rows) vs "
            f"{statistics.median(samples['small']):.3f} ms (10 rows)",
            flush=True,
        )
        emit(
            "pg_claim_next_p99_10k_vs_10",
            p99_big,
            "ms",
            p99_small,
            f"<= {TARGET:g}x",
            p99_big <= TARGET * p99_small,
        )
        p99_sleeping = pct(samples["sleeping"], 0.99)
        print(
            f"claim_next p50: {statistics.median(samples['sleeping']):.3f} ms (10 runnable, 10 000 WAITING)",
            flush=True,
        )
        emit(
            "pg_claim_next_p99_10k_sleeping_vs_0",
            p99_sleeping,
            "ms",
            p99_small,
            f"<= {SLEEPING_TARGET:g}x",
            p99_sleeping <= SLEEPING_TARGET * p99_small,
        )
    finally:
        for store, conn in stores.values():
            await conn.close()  # type: ignore[attr-defined]
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500, help="timed claims per table")
    args = parser.parse_args()
    with running_postgres(fast=True) as server:
        urls = (server.create_database(name) for name in ("claim_small", "claim_big", "claim_sleeping"))
        asyncio.run(bench(*urls, args.n))


if __name__ == "__main__":
    main()
