"""``job pause`` / ``job resume`` against a real worker process: a running job stops at its step boundary
(never inside a tool call) and frees its slot, resume runs the rest once; a job parked at an approval is
let go of when paused; a SIGKILL while a pause is being taken leaves the job paused or running, never lost."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from test_worker import create_jobs, poll, rows, spawn_worker, step_lines, worker_env

from agentlife.stores import JobStatus, store_from_url
from procs import REPO, agent_env, cli_in_process, wait_for


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
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


def job(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli_in_process("job", *args, "--database-url", url)


def status_is(url: str, job_id: str, status: str) -> bool:
    return rows(url)[job_id].status == status


def runnable(url: str) -> dict[str, int]:
    async def go() -> dict[str, int]:
        store = store_from_url(url)
        await store.open()
        try:
            return await store.count_runnable()
        finally:
            await store.close()

    return anyio.run(go)


def effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "traces" / "effects"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_job_paused_in_a_long_step_stops_at_its_boundary_and_resume_runs_the_rest(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(db_url, "p-1")
    env = worker_env(tmp_path, db_url, WORKER_GATE="1", WORKER_TOOL="1", WORKER_STEPS="3")
    procs.append(worker := spawn_worker(env))
    traces = tmp_path / "traces"
    wait_for(traces / "waiting-p-1-1")  # step 0 is running, held at its gate
    said = job(db_url, "pause", "p-1", "--reason", "checking the deploy", "--actor", "ops@host")
    assert said.returncode == 0, said.stderr
    assert "pause requested: it is RUNNING" in said.stdout
    assert rows(db_url)["p-1"].status == "RUNNING"  # a step is never cut: it runs to its end
    (traces / "gate-p-1").touch()
    poll(lambda: status_is(db_url, "p-1", "PAUSED"))
    assert [line[2] for line in step_lines(tmp_path)] == ["0"]  # stopped before step 1
    # The worker's slot is free: another job runs to its end while p-1 stays paused.
    create_jobs(db_url, "other")
    (traces / "gate-other").touch()
    poll(lambda: status_is(db_url, "other", "COMPLETED"))
    assert rows(db_url)["p-1"].status == "PAUSED"
    shown = job(db_url, "show", "p-1")
    assert "PAUSED" in shown.stdout and "paused      by ops@host" in shown.stdout, shown.stdout
    assert "checking the deploy" in shown.stdout
    listed = job(db_url, "list", "--status", "PAUSED")
    assert "p-1" in listed.stdout and "other" not in listed.stdout, listed.stdout
    resumed = job(db_url, "resume", "p-1", "--actor", "ops@host")
    assert resumed.returncode == 0 and "resumed: PENDING" in resumed.stdout, resumed
    poll(lambda: status_is(db_url, "p-1", "COMPLETED"))
    steps = [(line[1], line[2]) for line in step_lines(tmp_path) if line[0] == "p-1"]
    assert steps == [("1", "0"), ("2", "1"), ("2", "2")]  # the rest ran once, on the next attempt
    done = [e for e in effects(tmp_path) if e.startswith("p-1/")]
    assert sorted(done) == sorted(set(done)) and len(done) == 3  # no tool call ran twice
    history = [e.get("error_class") for e in rows(db_url)["p-1"].error]
    assert history == ["PauseRequested", "Resumed"]  # a pause is no crash
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=30)
    assert worker.returncode == 143  # drained


def test_a_job_paused_at_its_approval_is_let_go_of_and_approved_after_resume(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(db_url, "a-1")
    env = worker_env(
        tmp_path, db_url, WORKER_RESTRICTED="1", WORKER_STEPS="1", AGENTLIFE_APPROVAL_POLL_SECONDS="0.1"
    )
    procs.append(worker := spawn_worker(env))
    poll(lambda: status_is(db_url, "a-1", "WAITING_FOR_APPROVAL"))
    assert job(db_url, "pause", "a-1").returncode == 0
    assert rows(db_url)["a-1"].status == "PAUSED"
    refused = job(db_url, "approve", "a-1")
    assert (
        refused.returncode == 4 and "cannot approve job a-1: it is PAUSED" in refused.stdout + refused.stderr
    )
    # The parked process sees the pause at its next poll and lets go of the job: the slot runs another.
    create_jobs(db_url, "other")
    poll(lambda: status_is(db_url, "other", "WAITING_FOR_APPROVAL"))
    assert rows(db_url)["a-1"].status == "PAUSED"
    assert job(db_url, "resume", "a-1").returncode == 0
    assert rows(db_url)["a-1"].status == "WAITING_FOR_APPROVAL"
    assert job(db_url, "approve", "a-1").returncode == 0
    assert job(db_url, "pause", "other").returncode == 0  # frees the one slot again, for a-1
    poll(lambda: status_is(db_url, "a-1", "COMPLETED"))
    deploys = (tmp_path / "traces" / "deploys").read_text().split("\n")
    assert sum(1 for line in deploys if line.startswith("a-1 ")) == 1
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=30)
    assert worker.returncode == 143  # drained


def test_a_sigkill_while_a_pause_is_taken_leaves_the_job_paused_never_lost(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(db_url, "k-1")
    env = worker_env(tmp_path, db_url, WORKER_GATE="1", WORKER_STEPS="2")
    procs.append(worker := spawn_worker(env))
    wait_for(tmp_path / "traces" / "waiting-k-1-1")
    assert job(db_url, "pause", "k-1").returncode == 0
    worker.kill()  # mid-step, the pause requested and not yet taken
    worker.communicate()
    assert rows(db_url)["k-1"].status == "RUNNING"

    async def reap() -> list[str]:
        store = store_from_url(db_url)
        await store.open()
        try:
            return [d.status for d in await store.reap(60, now=time.time() + 120)]
        finally:
            await store.close()

    assert anyio.run(reap) == ["PAUSED"]
    row = rows(db_url)["k-1"]
    assert row.status == JobStatus.PAUSED and row.error[-1]["error_class"] == "HeartbeatStale"
    assert anyio.run(reap) == []  # no reaper touches a paused row
    assert job(db_url, "resume", "k-1").stdout.strip() == "job k-1 resumed: RETRYING"


def test_an_event_sent_to_a_job_paused_at_its_wait_takes_effect_on_resume(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    create_jobs(db_url, "l-1", agent="listener")
    traces = tmp_path / "traces"
    traces.mkdir()
    env = agent_env(
        tmp_path / "data",
        WAIT_DIR=str(traces),
        AGENTLIFE_DATABASE_URL=db_url,
        AGENTLIFE_PARK_AFTER_SECONDS="0",
    )
    command = [sys.executable, "-m", "agentlife", "worker", "agents.wait_agent:Listener"]
    procs.append(
        worker := subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    )
    poll(lambda: status_is(db_url, "l-1", "WAITING"))
    assert job(db_url, "pause", "l-1", "--reason", "hold the answers").returncode == 0
    for n in ("1", "2"):
        sent = job(db_url, "send", "l-1", "answer", "--payload", n)
        assert sent.returncode == 0, sent.stderr  # accepted and kept while paused
    assert rows(db_url)["l-1"].status == "PAUSED" and not (traces / "after").exists()
    assert runnable(db_url) == {}  # the events woke nothing: no worker would claim it
    assert job(db_url, "resume", "l-1").stdout.strip() == "job l-1 resumed: WAITING"
    poll(lambda: status_is(db_url, "l-1", "COMPLETED"))
    assert rows(db_url)["l-1"].result == {"got": [1, 2]}
    assert len((traces / "before").read_text().splitlines()) == 1  # nothing before the wait ran twice
    assert len((traces / "after").read_text().splitlines()) == 1
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=30)


def test_bad_input_to_pause_and_resume_is_one_clear_line_and_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentlife.db'}"
    create_jobs(url, "b-1", "b-done")
    rows_before = rows(url)
    asks = [
        (("pause", "nope"), 3, "job nope does not exist"),
        (("resume", "b-1"), 4, "cannot resume job b-1: it is PENDING (resume needs PAUSED or RUNNING)"),
        (("pause", "b-1", "--reason", "two\nlines"), 2, "the reason must be printable text on one line"),
        (("pause", "b-1", "--reason", "x" * 10_000), 2, "the reason must be at most 500 characters"),
        (("pause", "b-1", "--actor", "ops\x1b[31m"), 2, "the actor must be printable text on one line"),
        (("pause", "b-1", "--actor", "a" * 10_000), 2, "the actor must be 1 to 200 characters"),
        (("pause", "../x"), 2, "job id"),
    ]
    for args, code, needle in asks:
        done = job(url, *args)
        said = done.stdout + done.stderr
        assert done.returncode == code and needle in said, (args, done)
        assert len(said.strip().splitlines()) == 1 and "Traceback" not in said, said
    assert rows(url) == rows_before
    anyio.run(_finish_row, url, "b-done")
    ended = job(url, "pause", "b-done")
    assert ended.returncode == 4 and "cannot pause job b-done: it is COMPLETED" in ended.stdout + ended.stderr


async def _finish_row(url: str, job_id: str) -> None:
    store = store_from_url(url)
    await store.open()
    try:
        claimed = await store.claim(job_id, 1)
        await store.set_status(job_id, claimed.attempt, JobStatus.COMPLETED)
    finally:
        await store.close()
