"""A running job's output: publish -> follower, model text -> follower, the cost of publish and of followers.

Run: python benchmarks/bench_output.py  (one JSON object per line; a real PostgreSQL server, fsync on)

- ``publish_to_follower_p50``: `ctx.publish`'s store write (`publish_output`) until a follower in another
  store (its own pool and ``LISTEN`` connection) yields the event. Target <= 50 ms. The SQLite figure (a
  polling follower) is a reference.
- ``publish_cost_p50``: one publish (lock the job row, look the call up, insert; one transaction) against a
  heartbeat, the store's one-statement fenced ``UPDATE``, measured alternately.
- ``delta_to_follower_p50_50_jobs``: 50 jobs stream model text at once in one process (one store, one
  `DeltaBuffer` and sending task each, text masked and held back as a job's is), a token every 20 ms each;
  a follower store of its own (its pool, its ``LISTEN`` connection) follows all 50. From a token's `add`
  to the follower yielding it. Target <= 150 ms.
- ``step_with_100_followers``: a job's step (5 publishes and 300 streamed tokens) with 100 followers of
  that job in another process, against the same step with none. Target <= 1.1x.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _pg import running_postgres
from agentlife._output._deltas import DeltaBuffer
from agentlife._output._follow import follow_job
from agentlife._redact import Redactor
from agentlife.stores import CheckpointStore, PostgresStore, SQLiteStore, store_from_url

N = 200
JOBS = 50
TOKEN_SECONDS = 0.02


def emit(metric: str, value: float, unit: str, baseline: float | None, target: str, passed: bool) -> None:
    ratio = None if baseline in (None, 0) else round(value / baseline, 3)  # type: ignore[operator]
    line = {
        "bench": "output",
        "metric": metric,
        "value": round(value, 4),
        "unit": unit,
        "baseline": None if baseline is None else round(baseline, 4),
        "ratio": ratio,
        "target": target,
        "pass": passed,
    }
    print(json.dumps(line), flush=True)


async def _running(store: CheckpointStore, job_id: str) -> None:
    await store.create_job(job_id, "bench", None)
    await store.claim(job_id, 1)


async def publish_to_follower(writer: CheckpointStore, reader: CheckpointStore, job_id: str) -> list[float]:
    """Latencies (ms) from a publish's start to a live follower in another store yielding it."""
    await _running(writer, job_id)
    seen: dict[int, float] = {}
    started: dict[int, float] = {}
    async with anyio.create_task_group() as tasks:

        async def follow() -> None:
            async with follow_job(reader, job_id) as events:
                async for event in events:
                    if event.kind == "published":
                        seen[int(event.value)] = time.perf_counter()
                        if len(seen) == N:
                            return

        tasks.start_soon(follow)
        await anyio.sleep(0.3)
        for i in range(N):
            started[i] = time.perf_counter()
            await writer.publish_output(job_id, 1, f"{job_id}/0/{i}", "n", str(i).encode())
            while i not in seen:
                await anyio.sleep(0.0005)
    return [(seen[i] - started[i]) * 1000 for i in range(N)]


async def publish_cost(store: CheckpointStore) -> tuple[float, float]:
    await _running(store, "cost")
    mine: list[float] = []
    base: list[float] = []
    for i in range(N):
        start = time.perf_counter()
        await store.publish_output("cost", 1, f"cost/0/{i}", "n", b"1")
        mine.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        await store.heartbeat("cost", 1)
        base.append((time.perf_counter() - start) * 1000)
    return statistics.median(mine), statistics.median(base)


async def deltas_to_follower(writer: CheckpointStore, reader: CheckpointStore) -> list[float]:
    """50 jobs streaming at once; latencies (ms) from a token's add to a follower seeing it."""
    ids = [f"stream-{n}" for n in range(JOBS)]
    for job_id in ids:
        await _running(writer, job_id)
    latencies: list[float] = []
    redactor = Redactor(["sk-bench-secret-value-0123456789"])
    async with anyio.create_task_group() as tasks:
        buffers = []
        for job_id in ids:

            async def send(payloads: object, job_id: str = job_id) -> None:
                await writer.send_deltas(job_id, payloads)  # type: ignore[arg-type]

            buffer = DeltaBuffer(send, redactor, can_send=writer.has_free_connection)
            buffers.append(buffer)
            tasks.start_soon(buffer.run)

        async def follow(job_id: str) -> None:
            async with follow_job(reader, job_id) as events:
                async for event in events:
                    if event.kind == "delta":
                        now = time.perf_counter()
                        for word in event.value["text"].split():
                            if word.startswith("t"):
                                latencies.append((now - float(word[1:])) * 1000)

        for job_id in ids:
            tasks.start_soon(follow, job_id)
        await anyio.sleep(0.5)

        async def stream(buffer: DeltaBuffer, call: str) -> None:
            for _ in range(150):
                buffer.add(call, f" t{time.perf_counter():.6f}")
                await anyio.sleep(TOKEN_SECONDS)

        async with anyio.create_task_group() as streams:
            for job_id, buffer in zip(ids, buffers, strict=True):
                streams.start_soon(stream, buffer, f"{job_id}/0/0")
        await anyio.sleep(0.5)
        tasks.cancel_scope.cancel()
    return latencies


FOLLOWERS_SCRIPT = """
import sys, anyio
from agentlife.stores import store_from_url
from agentlife._output._follow import follow_job

async def main():
    store = store_from_url(sys.argv[1]); await store.open()
    async def one():
        async with follow_job(store, sys.argv[2]) as events:
            async for _ in events:
                pass
    async with anyio.create_task_group() as tasks:
        for _ in range(int(sys.argv[3])):
            tasks.start_soon(one)
        await anyio.sleep(1.0)
        print("ready", flush=True)
        await anyio.sleep(3600)

anyio.run(main)
"""


async def one_step(store: CheckpointStore, job_id: str, step: int, buffer: DeltaBuffer) -> float:
    start = time.perf_counter()
    for i in range(5):
        await store.publish_output(job_id, 1, f"{job_id}/{step}/{i}", "progress", b'{"done": 1}')
    for n in range(300):
        buffer.add(f"{job_id}/{step}/9", f" word{n}")
        if n % 10 == 0:
            await anyio.sleep(0.001)
    buffer.finish(f"{job_id}/{step}/9")
    await buffer.flush()
    return (time.perf_counter() - start) * 1000


async def step_with_followers(url: str) -> tuple[float, float]:
    store = store_from_url(url)
    await store.open()
    try:
        for job_id in ("alone", "followed"):
            await _running(store, job_id)
        followers = subprocess.Popen(
            [sys.executable, "-c", FOLLOWERS_SCRIPT, url, "followed", "100"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert followers.stdout is not None
            await anyio.to_thread.run_sync(followers.stdout.readline)
            alone: list[float] = []
            followed: list[float] = []
            async with anyio.create_task_group() as tasks:
                buffers = {}
                for job_id in ("alone", "followed"):

                    async def send(payloads: object, job_id: str = job_id) -> None:
                        await store.send_deltas(job_id, payloads)  # type: ignore[arg-type]

                    buffers[job_id] = DeltaBuffer(send, Redactor(), can_send=store.has_free_connection)
                    tasks.start_soon(buffers[job_id].run)
                for step in range(40):  # alternated: drift on a shared machine hits both alike
                    alone.append(await one_step(store, "alone", step, buffers["alone"]))
                    followed.append(await one_step(store, "followed", step, buffers["followed"]))
                tasks.cancel_scope.cancel()
            return statistics.median(followed), statistics.median(alone)
        finally:
            followers.kill()
            followers.wait()
    finally:
        await store.close()


async def bench_postgres(url: str) -> None:
    writer, reader = PostgresStore(url), PostgresStore(url)
    for store in (writer, reader):
        await store.open()
    await writer.init_schema()
    try:
        latencies = await publish_to_follower(writer, reader, "follow")
        p50 = statistics.median(latencies)
        emit(
            "publish_to_follower_p50: PostgreSQL, a publish until a follower in another store yields it",
            p50,
            "ms",
            None,
            "<= 50 ms",
            p50 <= 50,
        )
        mine, base = await publish_cost(writer)
        emit(
            "publish_cost_p50: PostgreSQL, one publish against a heartbeat's fenced UPDATE",
            mine,
            "ms",
            base,
            "reference (vs a heartbeat)",
            True,
        )
        deltas = await deltas_to_follower(writer, reader)
        p50 = statistics.median(deltas)
        emit(
            "delta_to_follower_p50_50_jobs: PostgreSQL, a token's text until a follower yields it",
            p50,
            "ms",
            None,
            "<= 150 ms",
            p50 <= 150,
        )
    finally:
        await reader.close()
        await writer.close()
    followed, alone = await step_with_followers(url)
    emit(
        "step_with_100_followers: a step (5 publishes, 300 tokens) followed by 100, against none",
        followed,
        "ms",
        alone,
        "<= 1.1x",
        followed <= 1.1 * alone,
    )


async def bench_sqlite() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        writer, reader = SQLiteStore(Path(tmp) / "bench.db"), SQLiteStore(Path(tmp) / "bench.db")
        for store in (writer, reader):
            await store.open()
        try:
            latencies = await publish_to_follower(writer, reader, "follow")
            emit(
                "sqlite_publish_to_follower_p50: a polling follower",
                statistics.median(latencies),
                "ms",
                None,
                "reference",
                True,
            )
            mine, base = await publish_cost(writer)
            emit(
                "sqlite_publish_cost_p50: one publish against a heartbeat",
                mine,
                "ms",
                base,
                "reference (vs a heartbeat)",
                True,
            )
        finally:
            await reader.close()
            await writer.close()


def main() -> None:
    with running_postgres(fast=False) as server:
        asyncio.run(bench_postgres(server.create_database("bench")))
    asyncio.run(bench_sqlite())


if __name__ == "__main__":
    main()
