"""Warm workers (``python -m agentlife worker``), each against a baseline measured in the same run.

* per-job start in a warm worker (its marginal wall time per job: a worker running N queued jobs vs one
  running 1) vs spawning ``python -m agentlife run`` per job (median process wall time); target <= 0.1x
* jobs/s of 2 workers vs 1 on IO-bound jobs (one 0.2 s wait each) on a real PostgreSQL, from the first
  claim to the last job's exit as the workers log them; target >= 1.8x
* claim latency (``claim_next``, p99) with 10 000 runnable rows vs 10, PostgreSQL; target <= 1.5x (the
  claim goes through the partial index on the runnable rows)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import REPO, child_env, emit, median

from _pg import running_postgres
from agentlife.stores import store_from_url


async def create_jobs(url: str, agent: str, ids: list[str]) -> None:
    store = store_from_url(url)
    await store.open()
    try:
        await store.init_schema()
        for job_id in ids:
            await store.create_job(job_id, agent, None)
    finally:
        await store.close()


def wall(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "agentlife", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args} exited {done.returncode}: {done.stderr[-500:]}")
    return time.perf_counter() - started, done.stdout


def bench_job_start(jobs: int, spawns: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(AGENTLIFE_DATA_DIR=tmp, AGENTLIFE_HEALTH_PORT="off")
        per_spawn = [
            wall(["run", "bench_agents:QuickAgent", "--job-id", f"spawn-{i}"], env)[0] for i in range(spawns)
        ]
        url = f"sqlite:///{tmp}/agentlife.db"
        asyncio.run(create_jobs(url, "quick", [f"one-{i}" for i in range(3)]))
        ones = [wall(["worker", "bench_agents:QuickAgent", "--max-jobs", "1"], env)[0] for _ in range(3)]
        asyncio.run(create_jobs(url, "quick", [f"many-{i}" for i in range(jobs)]))
        many, _ = wall(["worker", "bench_agents:QuickAgent", "--max-jobs", str(jobs)], env)
    spawn = median(per_spawn)
    warm = (many - median(ones)) / (jobs - 1)
    emit(
        "worker",
        "per-job start: warm worker (marginal) vs python -m agentlife run per job",
        warm * 1000,
        "ms",
        baseline=spawn * 1000,
        target="<= 0.1x",
        ok=warm / spawn <= 0.1,
    )


def job_spans(logs: list[str]) -> tuple[float, float]:
    """(first claim, last job exit) as unix times, from the workers' JSON logs."""
    claims, exits = [], []
    for text in logs:
        for line in text.splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if str(record.get("msg", "")).startswith("claimed job"):
                claims.append(record["ts"])
            elif record.get("event") == "job_ended" and record.get("outcome") == "done":
                exits.append(record["ts"])
    return min(claims), max(exits)


def throughput(url: str, tmp: str, workers: int, jobs: int, tag: str) -> float:
    ids = [f"{tag}-{i:03d}" for i in range(jobs)]
    asyncio.run(create_jobs(url, "waiting", ids))
    env = child_env(AGENTLIFE_DATA_DIR=tmp, AGENTLIFE_HEALTH_PORT="off", AGENTLIFE_DATABASE_URL=url)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "agentlife", "worker", "bench_agents:WaitingAgent", "--idle-timeout", "1"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(workers)
    ]
    logs = [proc.communicate(timeout=120)[0] for proc in procs]
    first, last = job_spans(logs)
    return jobs / (last - first)


def bench_parallel(jobs: int) -> None:
    with running_postgres() as server, tempfile.TemporaryDirectory() as tmp:
        url = server.create_database("bench_worker")
        one = throughput(url, tmp, 1, jobs, "one")
        two = throughput(url, tmp, 2, jobs, "two")
    emit(
        "worker",
        "IO-bound jobs/s: 2 workers vs 1 (PostgreSQL)",
        two,
        "jobs/s",
        baseline=one,
        target=">= 1.8x",
        ok=two / one >= 1.8,
    )


async def claim_p99s(url: str, claims: int, warmup: int = 30) -> tuple[float, float]:
    """p99 of ``claim_next(agent)`` for an agent with 10 runnable rows and one with 10 000, in one table.

    Claims alternate between the two agents (so a busy neighbour on the machine hits both alike), after a
    warm-up that prepares the statements; each claimed row is put back as runnable, untimed.
    """
    import asyncpg

    conn = await asyncpg.connect(url)
    store = store_from_url(url)
    await store.open()
    try:
        await store.init_schema()
        for agent, rows in (("few", 10), ("many", 10_000)):
            await conn.execute(
                "INSERT INTO job (id, agent_id, status, not_before)"
                " SELECT $1 || g, $1, 'PENDING', now() - g * interval '1 ms' FROM generate_series(1, $2) g",
                agent,
                rows,
            )
        await conn.execute("ANALYZE job")
        times: dict[str, list[float]] = {"few": [], "many": []}
        for i in range(warmup + claims):
            for agent in ("few", "many"):
                started = time.perf_counter()
                row = await store.claim_next(agent)
                elapsed = time.perf_counter() - started
                assert row is not None
                if i >= warmup:
                    times[agent].append(elapsed)
                await conn.execute(
                    "UPDATE job SET status = 'PENDING', not_before = now() WHERE id = $1", row.id
                )
    finally:
        await store.close()
        await conn.close()

    def p99(values: list[float]) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(len(values) * 0.99))]

    return p99(times["few"]), p99(times["many"])


def bench_claim(claims: int) -> None:
    with running_postgres() as server:
        few, many = asyncio.run(claim_p99s(server.create_database("bench_claim"), claims))
    emit(
        "worker",
        "claim_next p99: 10 000 runnable rows vs 10 (PostgreSQL)",
        many * 1000,
        "ms",
        baseline=few * 1000,
        target="<= 1.5x",
        ok=many / few <= 1.5,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="jobs per worker run (default 30)")
    parser.add_argument("--spawns", type=int, default=7, help="python -m agentlife run processes (default 7)")
    parser.add_argument("--claims", type=int, default=300, help="timed claims per table size (default 300)")
    args = parser.parse_args()
    bench_job_start(args.jobs, args.spawns)
    bench_parallel(args.jobs)
    bench_claim(args.claims)
