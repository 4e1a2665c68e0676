"""Claim latency of `PostgresStore.claim_next` with 10 000 runnable rows against 10, on a real PostgreSQL.

Metric (one JSON object per line):

- ``pg_claim_next_p99_10k_vs_10``: p99 of ``claim_next()`` on a job table holding 10 000 runnable
  rows, against the same on a table holding 10, claims on the two databases interleaved in the same run.
  Target <= 1.5x: the claim walks the partial index in its order (priority, ``not_before``) and stops at
  the first row it can lock, so the table's size must not show. Each claimed row is put back (untimed) at
  the end of the queue, so both tables keep their size for the whole run.

- ``pg_claim_next_p99_10k_sleeping_vs_0``: p99 of ``claim_next()`` on a table holding 10 runnable rows and
  10 000 jobs parked at a durable wait (WAITING, ``not_before`` in the future), against the same table
  without them. Target <= 1.2x: the waiting rows sit in the same partial index after every due row, so the
  claim never reads them.

- ``pg_claim_next_p99_keys_vs_none``: p99 of the limited claim (``AGENTLIFE_CONCURRENCY_KEY_LIMIT``; 10 000
  runnable rows over 50 concurrency keys, 2 rows of each RUNNING, limit 1 000), against the plain claim of
  the same table. Target <= 2x: the running rows are counted once per claim, the first row of a limited key
  probed in its own index, a slot found among the key's running rows.

- ``pg_claim_next_p99_past_1000_full_vs_none``: the same limited claim when 1 000 runnable rows of a key at
  its limit come first in the queue, against the plain claim. Reported: the claim reads past those rows in
  index order (the price of skipping a full key; the table's size does not show).

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
from agentlife.stores._limits import ClaimLimits

WARMUP = 30
TARGET = 1.5
SLEEPING_TARGET = 1.2
KEYS_TARGET = 2.0


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
            "EXPLAIN SELECT id FROM job WHERE status IN ('PENDING', 'RETRYING', 'WAITING')"
            " AND (not_before IS NULL OR not_before <= now())"
            " ORDER BY priority DESC, not_before NULLS FIRST, id LIMIT 1 FOR UPDATE SKIP LOCKED"
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


async def keyed(url: str, full_first: int) -> tuple[PostgresStore, object]:
    """10 000 runnable rows over 50 keys with 2 RUNNING rows each; ``full_first`` rows of a key at its
    limit (2 RUNNING, limit 2) ahead of them in the queue."""
    import asyncpg

    store = PostgresStore(url, max_size=2)
    await store.open()
    await store.init_schema()
    conn = await asyncpg.connect(url)
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, updated_at, not_before, concurrency_key)"
        " SELECT 'job-' || i, 'agent-0', 'PENDING', '{}'::jsonb, now(),"
        " now() - make_interval(secs => 20000 - i), 'key-' || (i % 50) FROM generate_series(1, 10000) AS i"
    )
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, updated_at, heartbeat_at, concurrency_key)"
        " SELECT 'run-' || i, 'agent-0', 'RUNNING', '{}'::jsonb, now(), now(), 'key-' || (i % 50)"
        " FROM generate_series(1, 100) AS i"
    )
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, updated_at, not_before, concurrency_key)"
        " SELECT 'full-' || i, 'agent-0', 'PENDING', '{}'::jsonb, now(),"
        " now() - make_interval(secs => 30000 - i), 'full' FROM generate_series(1, $1) AS i",
        full_first,
    )
    await conn.execute(
        "INSERT INTO job (id, agent_id, status, payload, updated_at, heartbeat_at, concurrency_key)"
        " SELECT 'full-run-' || i, 'agent-0', 'RUNNING', '{}'::jsonb, now(), now(), 'full'"
        " FROM generate_series(1, 2) AS i"
    )
    await conn.execute("ANALYZE job")
    return store, conn


async def bench_keys(plain_url: str, full_url: str, n: int) -> None:
    plain, plain_conn = await keyed(plain_url, 0)
    full, full_conn = await keyed(full_url, 1000)
    # The claimed row goes back to the end of the queue, PENDING: the RUNNING counts stay as set up.
    requeue = "UPDATE job SET status = 'PENDING', not_before = now() WHERE id = $1"
    runs = {
        "none": (plain, plain_conn, None),
        "keys": (plain, plain_conn, ClaimLimits(key_default=1000)),
        "full": (full, full_conn, ClaimLimits(key_default=1000, key_limits={"full": 2})),
    }
    try:
        samples: dict[str, list[float]] = {name: [] for name in runs}
        gc.disable()
        try:
            for i in range(WARMUP + n):
                order = tuple(runs)
                for name in order if i % 2 == 0 else order[::-1]:
                    store, conn, limit = runs[name]
                    start = time.perf_counter()
                    claimed = await store.claim_next("agent-0", limits=limit)
                    elapsed = (time.perf_counter() - start) * 1000
                    assert claimed is not None and not claimed.id.startswith("full-")
                    await conn.execute(requeue, claimed.id)  # type: ignore[attr-defined]
                    if i >= WARMUP:
                        samples[name].append(elapsed)
        finally:
            gc.enable()
        none, keys, past = (pct(samples[name], 0.99) for name in ("none", "keys", "full"))
        print(
            f"claim_next p50: {statistics.median(samples['none']):.3f} ms plain, "
            f"{statistics.median(samples['keys']):.3f} ms with key limits, "
            f"{statistics.median(samples['full']):.3f} ms past 1 000 rows of a full key",
            flush=True,
        )
        emit(
            "pg_claim_next_p99_keys_vs_none",
            keys,
            "ms",
            none,
            f"<= {KEYS_TARGET:g}x",
            keys <= KEYS_TARGET * none,
        )
        emit("pg_claim_next_p99_past_1000_full_vs_none", past, "ms", none, "reported", True)
    finally:
        for store, conn, _ in (runs["none"], runs["full"]):
            await conn.close()  # type: ignore[attr-defined]
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500, help="timed claims per table")
    args = parser.parse_args()
    with running_postgres(fast=True) as server:
        urls = (server.create_database(name) for name in ("claim_small", "claim_big", "claim_sleeping"))
        asyncio.run(bench(*urls, args.n))
        keyed_urls = (server.create_database(name) for name in ("claim_keys", "claim_keys_full"))
        asyncio.run(bench_keys(*keyed_urls, args.n))


if __name__ == "__main__":
    main()
