"""Instant pickup on PostgreSQL: ``LISTEN``/``NOTIFY`` against the polling worker, measured in the same run.

* ``job create`` -> first step on an idle ``python -m agentlife worker``, p50 and p99: the worker woken by the
  create's notification vs the same worker with notifications off (``listen=False``: it polls, its wait
  doubling from 0.05 s to 1 s while idle). Jobs come one at a time, 1-2 s apart, so the worker is idle
  (and the polling one near its 1 s cap) when each arrives; target p50 <= 25 ms.
* ``job send`` -> the next step of the job parked waiting for that event (``ctx.wait_for_event`` without a
  timeout) on an idle worker, p50 and p99: woken by the send's notification vs polling, as above; target
  p50 <= 50 ms.
* queries per second of 50 idle workers (the worker's loop: claim, wait, the wait doubling to its cap while
  nothing comes), counted by ``pg_stat_statements`` (else ``pg_stat_database.xact_commit``): with
  notifications and a 10 s fallback poll vs polling at today's 1 s cap. Target: no more than the fallback
  poll itself (50 / 10 s = 5/s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import REPO, child_env, emit

from agentlife import AgentProcess, Done, StepContext

AGENT = "pickup"
# The worker process with notifications off: the store sleeps in wait_for_work, as on SQLite.
_POLLING_WORKER = (
    "import sys; from agentlife.stores._postgres import PostgresStore;"
    " PostgresStore.__init__.__kwdefaults__['listen'] = False;"
    " from agentlife._cli import exit_now, main; exit_now(main())"
)


class PickupAgent(AgentProcess):
    """One step that notes when it began (``PICKUP_FILE``: ``job_id unix_time`` per line) and finishes."""

    agent_id = AGENT

    async def step(self, ctx: StepContext) -> Done | None:
        started = time.time()
        with open(os.environ["PICKUP_FILE"], "a") as out:
            out.write(f"{ctx.job.id} {started}\n")
        return Done(result={"ok": True})


class EventWaitAgent(AgentProcess):
    """Waits for the event ``go`` (parked: no timeout), then notes when the wait returned and finishes."""

    agent_id = f"{AGENT}-event"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.wait_for_event("go")
        with open(os.environ["PICKUP_FILE"], "a") as out:
            out.write(f"{ctx.job.id} {time.time()}\n")
        return Done(result={"ok": True})


def _steps(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    pairs = (line.split() for line in path.read_text().splitlines() if line.strip())
    return {job: float(at) for job, at in pairs}


async def _latencies(url: str, path: Path, jobs: int, tag: str) -> list[float]:
    """Create ``jobs`` jobs one at a time while the worker is idle; seconds from create to first step."""
    from agentlife.stores import store_from_url

    store = store_from_url(url)
    await store.open()
    try:
        deadline = time.monotonic() + 60
        while "warm" not in _steps(path):  # the worker is up and has run one job
            if time.monotonic() > deadline:
                raise RuntimeError("the worker never ran its warm-up job")
            await asyncio.sleep(0.05)
        out = []
        for i in range(jobs):
            await asyncio.sleep(random.uniform(1.0, 2.0))  # idle: the poller's wait has grown to its cap
            job_id = f"{tag}-{i}"
            created = time.time()
            await store.create_job(job_id, AGENT, None)
            while job_id not in (seen := _steps(path)):
                await asyncio.sleep(0.002)
            out.append(seen[job_id] - created)
        return out
    finally:
        await store.close()


def pickup(url: str, tmp: str, jobs: int, polling: bool) -> list[float]:
    tag = "poll" if polling else "notify"
    path = Path(tmp) / f"steps-{tag}"
    env = child_env(AGENTLIFE_DATA_DIR=tmp, AGENTLIFE_HEALTH_PORT="off", AGENTLIFE_DATABASE_URL=url)
    env["PICKUP_FILE"] = str(path)
    asyncio.run(_create(url, "warm"))
    head = [sys.executable, "-c", _POLLING_WORKER] if polling else [sys.executable, "-m", "agentlife"]
    worker = subprocess.Popen(
        [*head, "worker", "bench_pickup:PickupAgent", "--max-jobs", str(jobs + 1)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        latencies = asyncio.run(_latencies(url, path, jobs, tag))
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return latencies


async def _create(url: str, job_id: str) -> None:
    from agentlife.stores import store_from_url

    store = store_from_url(url)
    await store.open()
    try:
        await store.init_schema()
        await store.create_job(job_id, AGENT, None)
    finally:
        await store.close()


async def _event_latencies(url: str, path: Path, jobs: int, tag: str) -> list[float]:
    """Park ``jobs`` jobs on an event, then send each its event while the worker is idle; seconds from
    the send to the step after the wait."""
    from agentlife.stores import store_from_url

    store = store_from_url(url)
    await store.open()
    try:
        out = []
        for i in range(jobs):
            job_id = f"{tag}-{i}"
            await store.create_job(job_id, EventWaitAgent.agent_id, None)
            deadline = time.monotonic() + 60
            while (row := await store.get_job(job_id)) is None or row.status != "WAITING":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{job_id} never parked: {row}")
                await asyncio.sleep(0.01)
            await asyncio.sleep(random.uniform(1.0, 2.0))  # idle: the poller's wait has grown to its cap
            sent = time.time()
            await store.send_event(job_id, "go", None)
            while job_id not in (seen := _steps(path)):
                await asyncio.sleep(0.002)
            out.append(seen[job_id] - sent)
        return out
    finally:
        await store.close()


def event_pickup(url: str, tmp: str, jobs: int, polling: bool) -> list[float]:
    tag = "event-poll" if polling else "event-notify"
    path = Path(tmp) / f"steps-{tag}"
    env = child_env(AGENTLIFE_DATA_DIR=tmp, AGENTLIFE_HEALTH_PORT="off", AGENTLIFE_DATABASE_URL=url)
    env["PICKUP_FILE"] = str(path)
    asyncio.run(_init(url))
    head = [sys.executable, "-c", _POLLING_WORKER] if polling else [sys.executable, "-m", "agentlife"]
    worker = subprocess.Popen(
        [*head, "worker", "bench_pickup:EventWaitAgent", "--max-jobs", str(2 * jobs)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        latencies = asyncio.run(_event_latencies(url, path, jobs, tag))
        worker.wait(timeout=60)  # each job is two runs of the worker: the park and the resume
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return latencies


async def _init(url: str) -> None:
    from agentlife.stores import store_from_url

    store = store_from_url(url)
    await store.open()
    try:
        await store.init_schema()
    finally:
        await store.close()


def bench_event(server: Any, jobs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        notify = event_pickup(server.create_database("event_notify"), tmp, jobs, polling=False)
        poll = event_pickup(server.create_database("event_poll"), tmp, jobs, polling=True)
    p50, base50 = statistics.median(notify) * 1000, statistics.median(poll) * 1000
    emit("pickup", "job send -> waiting job's next step, p50: NOTIFY vs polling (PostgreSQL)", p50, "ms",
         baseline=base50, target="<= 50 ms", ok=p50 <= 50.0)  # fmt: skip
    p99, base99 = _p(notify, 0.99) * 1000, _p(poll, 0.99) * 1000
    emit("pickup", "job send -> waiting job's next step, p99: NOTIFY vs polling (PostgreSQL)", p99, "ms",
         baseline=base99, target="reported")  # fmt: skip


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def bench_latency(server: Any, jobs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        notify = pickup(server.create_database("pickup_notify"), tmp, jobs, polling=False)
        poll = pickup(server.create_database("pickup_poll"), tmp, jobs, polling=True)
    p50, base50 = statistics.median(notify) * 1000, statistics.median(poll) * 1000
    emit("pickup", "job create -> first step, p50: NOTIFY vs polling (PostgreSQL)", p50, "ms",
         baseline=base50, target="<= 25 ms", ok=p50 <= 25.0)  # fmt: skip
    p99, base99 = _p(notify, 0.99) * 1000, _p(poll, 0.99) * 1000
    emit("pickup", "job create -> first step, p99: NOTIFY vs polling (PostgreSQL)", p99, "ms",
         baseline=base99, target="reported")  # fmt: skip


async def _idle_loop(store: Any, cap: float, until: float) -> None:
    """The worker's idle loop: claim, wait for work, the wait doubling from 0.05 s up to ``cap``."""
    delay = 0.05
    while time.monotonic() < until:
        assert await store.claim_next(AGENT) is None
        wait = min(delay, until - time.monotonic())
        if wait <= 0:
            return
        delay = 0.05 if await store.wait_for_work(AGENT, wait) else min(delay * 2, cap)


async def _idle_qps(url: str, workers: int, listen: bool, cap: float, seconds: float) -> float:
    import asyncpg

    from agentlife.stores import PostgresStore

    stores = [PostgresStore(url, min_size=1, max_size=1, listen=listen) for _ in range(workers)]
    for store in stores:
        await store.open()
    await stores[0].init_schema()
    probe = await asyncpg.connect(url)
    try:
        settle = time.monotonic() + 2 * cap + 1  # every loop has reached its cap
        loops = [asyncio.create_task(_idle_loop(s, cap, settle + seconds)) for s in stores]
        await asyncio.sleep(settle - time.monotonic())
        count = await _statement_counter(probe)
        before = await probe.fetchval(count)
        await asyncio.sleep(seconds)
        after = await probe.fetchval(count)
        await asyncio.gather(*loops)
    finally:
        await probe.close()
        for store in stores:
            await store.close()
    return float(after - before) / seconds


async def _statement_counter(probe: Any) -> str:
    """The query counting this database's statements: pg_stat_statements' calls (exact, the probe's own
    left out) when the extension loads, else committed transactions (flushed about once a second)."""
    try:
        await probe.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await probe.execute("SELECT pg_stat_statements_reset()")
    except Exception:
        return "SELECT xact_commit + 0 FROM pg_stat_database WHERE datname = current_database()"
    return (
        "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND query NOT LIKE '%pg_stat%'"
    )


def bench_idle(server: Any, workers: int, seconds: float) -> None:
    # 50 workers hold a pooled connection each, and a LISTEN connection each with notifications on.
    server.execute("ALTER SYSTEM SET max_connections = 200")
    server.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    server.stop()
    server.start()
    polling = asyncio.run(_idle_qps(server.create_database("idle_poll"), workers, False, 1.0, seconds))
    notify = asyncio.run(_idle_qps(server.create_database("idle_notify"), workers, True, 10.0, seconds))
    emit("pickup", f"idle queries/s of {workers} workers: NOTIFY + 10 s fallback poll vs 1 s polling",
         notify, "queries/s", baseline=polling, target=f"<= {workers / 10:g}/s (the fallback poll)",
         ok=notify <= workers / 10 * 1.1)  # fmt: skip


if __name__ == "__main__":
    from _pg import running_postgres

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="timed pickups per worker (default 30)")
    parser.add_argument("--workers", type=int, default=50, help="idle workers (default 50)")
    parser.add_argument("--seconds", type=float, default=20.0, help="idle window counted (default 20)")
    args = parser.parse_args()
    with running_postgres() as pg:
        bench_latency(pg, args.jobs)
        bench_event(pg, max(args.jobs // 2, 5))
        bench_idle(pg, args.workers, args.seconds)
