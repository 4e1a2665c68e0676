"""``agentlife.Client``: ``start`` -> ``result`` of a no-op job on an idle PostgreSQL worker, p50 and p99.

One ``python -m agentlife worker`` waits idle; the client starts one job at a time (0.3-0.6 s apart, so
the worker is idle when each arrives) and awaits its result: the worker is woken by the create's
notification, and the client's wait by the end notification of the ``job_ended`` trigger. Baseline, in
the same run: the same client with its wait polling the row (as on SQLite: 10 ms doubling to 0.5 s).
Target p50 <= 30 ms. Most of a round trip is the worker's run of the job (tens of ms on a loaded machine,
noisy); the part the wait itself adds is measured apart: from the row's end (its ``updated_at``, the
server's clock on this machine) to ``result`` returning.
"""

from __future__ import annotations

import argparse
import asyncio
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

from agentlife import AgentProcess, Client, Done, StepContext

AGENT = "client-bench"


class NoopAgent(AgentProcess):
    """Ends at once."""

    agent_id = AGENT

    async def step(self, ctx: StepContext) -> Done | None:
        return Done(result={"ok": True})


async def _round_trips(url: str, jobs: int, tag: str, polling: bool) -> tuple[list[float], list[float]]:
    from agentlife.stores import store_from_url

    store = store_from_url(url)
    await store.open()
    try:
        await store.init_schema()
    finally:
        await store.close()
    async with await Client.connect(url) as client:
        if polling:
            client._listen = lambda job_id: None  # type: ignore[method-assign]  # the SQLite wait
        await client.start(AGENT, None, job_id=f"{tag}-warm")
        await client.result(f"{tag}-warm", timeout=60)  # the worker is up, the LISTENs are open
        trips, tails = [], []
        for i in range(jobs):
            await asyncio.sleep(random.uniform(0.3, 0.6))
            began = time.perf_counter()
            job = await client.start(AGENT, None, job_id=f"{tag}-{i}")
            await client.result(job.job_id, timeout=60)
            trips.append(time.perf_counter() - began)
            returned = time.time()
            ended = (await client.get(job.job_id)).updated_at
            tails.append(returned - (ended or returned))
        return trips, tails


def round_trips(url: str, jobs: int, polling: bool) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(AGENTLIFE_DATA_DIR=tmp, AGENTLIFE_HEALTH_PORT="off", AGENTLIFE_DATABASE_URL=url)
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentlife",
                "worker",
                "bench_client:NoopAgent",
                "--max-jobs",
                str(jobs + 1),
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            return asyncio.run(_round_trips(url, jobs, "poll" if polling else "notify", polling))
        finally:
            worker.wait(timeout=60) if worker.poll() is None else None
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def bench(server: Any, jobs: int) -> None:
    notify, notify_tail = round_trips(server.create_database("client_notify"), jobs, polling=False)
    poll, poll_tail = round_trips(server.create_database("client_poll"), jobs, polling=True)
    p50, base50 = statistics.median(notify) * 1000, statistics.median(poll) * 1000
    emit("client", "Client start -> result of a no-op job, p50: NOTIFY vs polling (PostgreSQL)", p50, "ms",
         baseline=base50, target="<= 30 ms", ok=p50 <= 30.0)  # fmt: skip
    p99, base99 = _p(notify, 0.99) * 1000, _p(poll, 0.99) * 1000
    emit("client", "Client start -> result of a no-op job, p99: NOTIFY vs polling (PostgreSQL)", p99, "ms",
         baseline=base99, target="reported")  # fmt: skip
    tail, base_tail = statistics.median(notify_tail) * 1000, statistics.median(poll_tail) * 1000
    emit("client", "the job's end -> result() returns, p50: NOTIFY vs polling (PostgreSQL)", tail, "ms",
         baseline=base_tail, target="reported")  # fmt: skip


if __name__ == "__main__":
    from _pg import running_postgres

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="timed round trips (default 30)")
    args = parser.parse_args()
    with running_postgres() as server:
        bench(server, args.jobs)
