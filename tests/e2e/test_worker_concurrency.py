"""``python -m agentlife worker --concurrency N``: real worker processes, several jobs in one event loop.

Each job in its own task, cancel scope and log context: log lines never carry another job's id, ``/status``
lists every running job, ``/readyz`` is 200 while a slot is free, one job's crash leaves the others
running, and SIGTERM drains every running job inside the one grace period, each row left resumable.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_worker import (
    AGENT,
    TARGET,
    create_jobs,
    finish,
    free_port,
    http,
    poll,
    rows,
    spawn_worker,
    step_lines,
    worker_env,
)

from agentlife.constants import Constants
from agentlife.stores import JobStatus
from procs import json_lines, run_cli, wait_for


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agentlife.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentlife.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _status(port: int) -> dict[str, object]:
    status: dict[str, object] = json.loads(http(port, "/status")[1])
    return status


def _running(port: int) -> list[str]:
    jobs = _status(port)["jobs"]
    assert isinstance(jobs, list)
    return sorted(str(j["job_id"]) for j in jobs)


def test_the_log_lines_of_interleaved_jobs_each_name_only_their_own_job(
    tmp_path: Path, sqlite_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    ids = [f"log-{i}" for i in range(4)]
    create_jobs(sqlite_url, *ids)
    env = worker_env(tmp_path, sqlite_url, WORKER_LOG_LINES="25", WORKER_STEPS="2", WORKER_STEP_SECONDS="0")
    code, out = finish(spawn_worker(env, "--concurrency", "4", "--max-jobs", "4"))
    assert code == 0, out
    own = [line for line in json_lines(out) if str(line.get("msg", "")).startswith("own line of")]
    assert len(own) == 4 * 2 * 25
    for line in own:
        _, _, _, job, attempt, step, _ = str(line["msg"]).split()
        assert (line["job_id"], line["attempt"], line["step"]) == (job, int(attempt), int(step)), line
    # The jobs really ran at once: their lines alternate (a job's 25 lines of a step were not one run).
    order = [str(line["job_id"]) for line in own]
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert switches > 50, order[:60]
    # The worker's own lines name no job; the lines of a job's lifecycle name that job.
    ready = next(line for line in json_lines(out) if str(line.get("msg", "")).startswith("worker ready"))
    assert ready["job_id"] is None and ready["concurrency"] == 4
    for line in json_lines(out):
        if line.get("logger") == "agentlife.runtime" and "transition_to" in line:
            assert line["job_id"] in ids, line
    assert {r.status for r in rows(sqlite_url).values()} == {JobStatus.COMPLETED}


def test_status_lists_every_running_job_and_readyz_is_200_while_a_slot_is_free(
    tmp_path: Path, sqlite_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    port = free_port()
    create_jobs(sqlite_url, "a")
    worker = spawn_worker(worker_env(tmp_path, sqlite_url, port, WORKER_GATE="1"), "--concurrency", "2")
    procs.append(worker)
    wait_for(tmp_path / "traces" / "waiting-a-1")
    assert poll(lambda: _running(port) == ["a"])
    assert http(port, "/readyz") == (200, "ok\n")  # one slot of two is free
    create_jobs(sqlite_url, "b")
    wait_for(tmp_path / "traces" / "waiting-b-1")
    assert poll(lambda: _running(port) == ["a", "b"])
    assert poll(lambda: http(port, "/readyz") == (503, "busy\n"))  # both slots taken
    status = _status(port)
    jobs = {str(j["job_id"]): j for j in status["jobs"]}  # type: ignore[union-attr]
    assert jobs["a"]["state"] == "EXECUTING" and jobs["a"]["attempt"] == 1 and jobs["a"]["step"] == 0
    worker_part = status["worker"]
    assert isinstance(worker_part, dict) and worker_part["busy"] == 2 and worker_part["slots"] == 2
    (tmp_path / "traces" / "gate-a").touch()
    assert poll(lambda: _running(port) == ["b"])
    assert poll(lambda: http(port, "/readyz") == (200, "ok\n"))
    (tmp_path / "traces" / "gate-b").touch()
    assert poll(lambda: _running(port) == [])
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker)
    assert code == 143, out
    assert {r.status for r in rows(sqlite_url).values()} == {JobStatus.COMPLETED}


def test_one_jobs_crash_leaves_the_jobs_beside_it_running(
    tmp_path: Path, sqlite_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(sqlite_url, "good-1", "bad", "good-2")
    env = worker_env(tmp_path, sqlite_url, WORKER_GATE="1", WORKER_CRASH_JOB="bad")
    worker = spawn_worker(env, "--concurrency", "3", "--max-jobs", "3")
    procs.append(worker)
    wait_for(tmp_path / "traces" / "waiting-good-1-1")
    wait_for(tmp_path / "traces" / "waiting-good-2-1")
    # The poison job crashed while both others waited in their first step; they go on untouched.
    assert poll(lambda: rows(sqlite_url)["bad"].status == JobStatus.RETRYING)
    (tmp_path / "traces" / "gate-good-1").touch()
    (tmp_path / "traces" / "gate-good-2").touch()
    code, out = finish(worker)
    assert code == 0, out
    final = rows(sqlite_url)
    assert final["good-1"].status == final["good-2"].status == JobStatus.COMPLETED
    assert final["bad"].status == JobStatus.RETRYING
    assert final["bad"].error[-1]["error_class"] == "RuntimeError"
    assert sorted(line[0] for line in step_lines(tmp_path)).count("bad") == 1


def test_sigterm_drains_every_running_job_inside_one_grace_period_and_each_row_resumes(
    tmp_path: Path, sqlite_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    ids = ["d-1", "d-2", "d-3"]
    create_jobs(sqlite_url, *ids)
    scale = 0.1
    drain = Constants().scaled(scale).drain
    env = worker_env(tmp_path, sqlite_url, WORKER_GATE="1")
    worker = spawn_worker(env, "--concurrency", "3", "--time-scale", str(scale))
    procs.append(worker)
    for job in ids:
        wait_for(tmp_path / "traces" / f"waiting-{job}-1")
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    code, out = finish(worker)
    elapsed = time.monotonic() - started
    assert code == 143, out
    # Each gated step is cancelled at the one step deadline, cleanup shared: well inside the grace period.
    budget = drain.step_deadline_seconds + drain.cleanup_budget_seconds
    assert elapsed < budget + drain.sigkill_buffer_seconds / 2, (elapsed, budget)
    lines = json_lines(out)
    cancelled = [line for line in lines if str(line.get("msg")).startswith("step 0 cancelled at the drain")]
    assert sorted(str(line["job_id"]) for line in cancelled) == ids
    # Each job's move to DRAINING is logged from the signal's task, and names that job, not the worker.
    moved = [line for line in lines if line.get("transition_to") == "DRAINING"]
    assert sorted(str(line.get("job_id")) for line in moved) == ids
    handed_back = rows(sqlite_url)
    assert {(r.status, r.attempt) for r in handed_back.values()} == {(JobStatus.PENDING, 1)}
    # Every row resumes: a next worker (gates open) finishes all three.
    for job in ids:
        (tmp_path / "traces" / f"gate-{job}").touch()
    code, out = finish(spawn_worker(env, "--concurrency", "3", "--max-jobs", "3"))
    assert code == 0, out
    assert {(r.status, r.attempt) for r in rows(sqlite_url).values()} == {(JobStatus.COMPLETED, 2)}


def test_free_slots_claim_one_at_a_time_so_max_jobs_below_the_slots_runs_that_many(
    tmp_path: Path, any_url: str
) -> None:
    # Four free slots at boot, five queued jobs, --max-jobs 2: each slot's claim comes after the one before
    # and counts, so the third slot finds the limit reached instead of a third row.
    ids = [f"few-{i}" for i in range(5)]
    create_jobs(any_url, *ids)
    env = worker_env(tmp_path, any_url, WORKER_STEP_SECONDS="0.2", WORKER_STEPS="1")
    code, out = finish(spawn_worker(env, "--concurrency", "4", "--max-jobs", "2"))
    assert code == 0, out
    assert "ran 2 jobs (--max-jobs)" in out
    statuses = sorted((r.status, r.attempt) for r in rows(any_url).values())
    assert statuses == [(JobStatus.COMPLETED, 1)] * 2 + [(JobStatus.PENDING, 0)] * 3, statuses
    claimed = [line for line in json_lines(out) if str(line.get("msg", "")).startswith("claimed job")]
    assert len(claimed) == 2


@pytest.mark.slow(14)
def test_woken_slots_claim_one_at_a_time_and_a_drain_behind_a_stalled_claim_exits_143(
    tmp_path: Path, postgres_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    # Sixteen idle slots, then a sign of work while the job table refuses writes: every slot wakes to claim,
    # but only one claim reaches the store (and fails at its statement timeout); the others wait their turn
    # and the drain ends that wait, so no claim is made after SIGTERM.
    import anyio
    import asyncpg

    create_jobs(postgres_url)
    # The stalled claim fails at the server's statement timeout (4 s) rather than at the client's 10 s:
    # the SIGTERM must come before it, while the other slots still wait their turn.
    separator = "&" if "?" in postgres_url else "?"
    stalling_url = f"{postgres_url}{separator}statement_timeout=4000"
    worker = spawn_worker(worker_env(tmp_path, stalling_url), "--concurrency", "16")
    procs.append(worker)

    async def stall_wake_and_drain() -> None:
        conn = await asyncpg.connect(postgres_url)
        try:
            oid = await conn.fetchval("SELECT 'job'::regclass::oid")
            await _wait_for_backend(conn, "query LIKE 'LISTEN%'")  # the worker is up and idle
            lock = conn.transaction()
            await lock.start()
            await conn.execute("LOCK TABLE job IN EXCLUSIVE MODE")  # reads pass, claims wait
            notifier = await asyncpg.connect(postgres_url)
            try:  # its own transaction: the notification is sent now, the lock stays held
                await notifier.execute(f"SELECT pg_notify('agentlife_job_{oid}', '{AGENT}')")
            finally:
                await notifier.close()
            await _wait_for_backend(conn, "wait_event_type = 'Lock'")  # one claim stalled on the lock
            await anyio.sleep(0.3)  # and the other woken slots lined up behind it
            worker.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(lambda: worker.wait(timeout=60))
            await lock.rollback()
        finally:
            await conn.close()

    anyio.run(stall_wake_and_drain)
    code, out = finish(worker)
    assert code == 143, out
    failed = [line for line in json_lines(out) if str(line.get("msg", "")).startswith("claim failed")]
    assert len(failed) == 1, failed  # sixteen claims racing for the same rows would each have failed


async def _wait_for_backend(conn: Any, condition: str) -> None:
    """Until another session of the server matches ``condition`` (a fixed sleep lost the race under load)."""
    import anyio

    for _ in range(600):
        sql = (
            "SELECT count(*) FROM pg_stat_activity"
            f" WHERE pid <> pg_backend_pid() AND datname = current_database() AND {condition}"
        )
        if await conn.fetchval(sql):
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"no session of the server came to {condition}")


@pytest.mark.parametrize("bad", ["0", "-1", "1025", "2**63", "1.5", ""])
def test_a_concurrency_out_of_range_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    env = worker_env(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    result = run_cli("worker", TARGET, "--concurrency", bad, env=env)
    assert result.returncode == 2, result.stderr
    assert "--concurrency" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "x.db").exists()  # refused before anything opened
