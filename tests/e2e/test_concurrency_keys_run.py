"""Concurrency keys with real workers: 100 jobs over 5 keys, a limit of 2, two workers of 10 slots each.

Each job's steps leave fsynced traces (``tests/agents/worker_agent.py``); a job ran from its first step to
its last, a window inside the time its row was RUNNING, so the windows of a key overlapping more than
twice would prove the limit broken.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import anyio
import pytest
from test_worker import finish, poll, rows, spawn_worker, step_lines, worker_env

from agentlife.stores import JobStatus, store_from_url
from procs import run_cli

KEYS = tuple(f"tenant-{k}" for k in range(5))
PER_KEY = 20
LIMIT = 2


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentlife.db'}"
    return str(request.getfixturevalue("postgres_url"))


def _create(url: str) -> list[str]:
    """The jobs, created one key after another in turn, so each key's jobs are spread over the queue."""
    ids = [f"{key}-{i:02d}" for i in range(PER_KEY) for key in KEYS]

    async def go() -> None:
        store = store_from_url(url)
        await store.open()
        try:
            await store.init_schema()
            for job_id in ids:
                await store.create_job(job_id, "worker-agent", None, concurrency_key=job_id[:8])
        finally:
            await store.close()

    anyio.run(go)
    return ids


def _windows(tmp_path: Path) -> dict[str, tuple[float, float]]:
    """Each job's first and last step time, from the traces."""
    times: dict[str, list[float]] = defaultdict(list)
    for job, attempt, _step, _pid, _inst, _seen, at in step_lines(tmp_path):
        assert attempt == "1", job
        times[job].append(float(at))
    return {job: (min(ts), max(ts)) for job, ts in times.items()}


def _most_at_once(windows: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in windows] + [(end, -1) for _, end in windows])
    running = most = 0
    for _, change in edges:  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


def test_two_workers_never_run_more_than_a_keys_limit_and_start_each_key_in_creation_order(
    tmp_path: Path, db_url: str
) -> None:
    ids = _create(db_url)
    env = worker_env(
        tmp_path,
        db_url,
        AGENTLIFE_CONCURRENCY_KEY_LIMIT=str(LIMIT),
        WORKER_STEPS="3",
        WORKER_STEP_SECONDS="0.02",
    )
    args = ("--concurrency", "10", "--idle-timeout", "2")
    workers: list[subprocess.Popen[bytes]] = [spawn_worker(env, *args) for _ in range(2)]
    try:
        results = [finish(w, timeout=150) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.communicate()
    for code, out in results:
        assert code == 0, out[-3000:]
    final = rows(db_url)
    assert {final[j].status for j in ids} == {JobStatus.COMPLETED}
    assert {final[j].attempt for j in ids} == {1}
    windows = _windows(tmp_path)
    assert sorted(windows) == sorted(ids)
    # Both workers ran jobs, several keys at once: the limit, not a lack of slots, held each key to 2.
    assert len({line[3] for line in step_lines(tmp_path)}) == 2
    assert _most_at_once(list(windows.values())) > LIMIT
    for key in KEYS:
        mine = [f"{key}-{i:02d}" for i in range(PER_KEY)]
        assert _most_at_once([windows[j] for j in mine]) <= LIMIT, key
        # Claimed in creation order with at most 2 running: when job n starts, at least n - 1 of the jobs
        # created before it have ended.
        for n, job in enumerate(mine):
            ended = sum(1 for earlier in mine[:n] if windows[earlier][1] < windows[job][0])
            assert ended >= n - 1, (job, ended)
    # What an operator sees of it.
    listed = run_cli("job", "list", "--concurrency-key", KEYS[0], "--json", "--limit", "100", env=env)
    assert listed.returncode == 0, listed.stderr
    shown = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(r["id"] for r in shown) == [f"{KEYS[0]}-{i:02d}" for i in range(PER_KEY)]
    assert {(r["concurrency_key"], r["priority"]) for r in shown} == {(KEYS[0], 0)}
    show = run_cli("job", "show", f"{KEYS[0]}-00", "--events", "0", env=env)
    assert show.returncode == 0, show.stderr
    assert f"  key         {KEYS[0]}\n  priority    0\n" in show.stdout, show.stdout


@pytest.mark.exhaustive
def test_a_killed_workers_jobs_hold_their_keys_slots_until_reaped_then_run_again(
    tmp_path: Path, db_url: str
) -> None:
    """SIGKILL a worker while it runs one job of each key (limit 1); its successor on the same host must not
    run another job of those keys before it has reaped the dead rows, then runs everything. (Two crashes:
    a third would open the agent's circuit breaker and hold the retries for its cooldown.)"""
    keys = ("red", "blue")
    ids = [f"{key}-{i}" for i in range(4) for key in keys]

    async def create() -> None:
        store = store_from_url(db_url)
        await store.open()
        try:
            await store.init_schema()
            for job_id in ids:
                await store.create_job(job_id, "worker-agent", None, concurrency_key=job_id.split("-")[0])
        finally:
            await store.close()

    anyio.run(create)
    env = worker_env(
        tmp_path, db_url, AGENTLIFE_CONCURRENCY_KEY_LIMIT="1", WORKER_STEPS="2", WORKER_STEP_SECONDS="0.4"
    )
    args = ("--concurrency", "6", "--time-scale", "0.1", "--idle-timeout", "3")
    first = spawn_worker(env, *args)
    try:
        poll(lambda: len({line[0] for line in step_lines(tmp_path)}) >= 2, timeout=60)
        first.send_signal(signal.SIGKILL)
        first.communicate()
        killed_at = time.time()
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    held = {j: r for j, r in rows(db_url).items() if r.status == JobStatus.RUNNING}
    assert sorted(held) == ["blue-0", "red-0"], sorted(held)
    # Its successor waits for the dead rows (the dead-owner check, one scaled heartbeat interval) idle.
    code, out = finish(spawn_worker(env, *args[:-1], "10"), timeout=120)
    assert code == 0, out[-3000:]
    final = rows(db_url)
    assert {final[j].status for j in ids} == {JobStatus.COMPLETED}, out[-2000:]
    for job_id in held:
        assert final[job_id].attempt == 2 and final[job_id].error[0]["error_class"] == "OwnerGone"
    # Each attempt's window; a killed attempt's row stayed RUNNING (its slot held) until it was reaped.
    spans: dict[tuple[str, str], list[float]] = defaultdict(list)
    for job, attempt, *_, at in step_lines(tmp_path):
        spans[(job, attempt)].append(float(at))
    windows = []
    for (job, attempt), times in spans.items():
        end = max(times)
        if job in held and attempt == "1":
            end = float(final[job].error[0]["at"])
            assert end >= killed_at - 1
        windows.append((job.split("-")[0], (min(times), end)))
    for key in keys:
        assert _most_at_once([w for k, w in windows if k == key]) <= 1, key
