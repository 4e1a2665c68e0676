"""Instant pickup on PostgreSQL: `PostgresStore.wait_for_work` on a real server, woken by ``NOTIFY`` from the
writes that make a job runnable; killed and refused LISTEN connections; schemas that must not cross-wake."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from agentlife.stores import PostgresStore
from procs import REPO, agent_env, run_cli

pytestmark = pytest.mark.anyio

AGENT = "notify-agent"
LONG = 30.0  # a wait no test should reach: True before it can only come from a notification


async def _open(url: str, **kwargs: Any) -> PostgresStore:
    store = PostgresStore(url, **kwargs)
    await store.open()
    await store.init_schema()
    return store


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[PostgresStore]:
    s = await _open(postgres_url)
    try:
        yield s
    finally:
        await s.close()


async def _listening(store: PostgresStore, agent: str = AGENT) -> None:
    """The first wait opens the LISTEN connection and returns True at once (it may have missed work)."""
    assert await store.wait_for_work(agent, LONG) is True
    assert store._signal._listener.listening


async def _woken_by(
    store: PostgresStore, action: Callable[[], Awaitable[object]], agent: str = AGENT, timeout: float = LONG
) -> tuple[bool, float]:
    """Start waiting, run ``action`` from elsewhere, return (what the wait returned, seconds it took)."""
    result: list[bool] = []

    async def wait() -> None:
        result.append(await store.wait_for_work(agent, timeout))

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(0.05)  # the waiter is parked on its event
        await action()
    return result[0], time.monotonic() - started


# -- wake-ups -----------------------------------------------------------------------------------------


async def test_job_create_from_another_process_wakes_the_waiter(
    tmp_path: Path, store: PostgresStore, postgres_url: str
) -> None:
    await _listening(store)
    env = agent_env(tmp_path, AGENTLIFE_DATABASE_URL=postgres_url)

    async def create() -> None:
        done = await anyio.to_thread.run_sync(
            lambda: run_cli("job", "create", AGENT, "--id", "from-cli", env=env)
        )
        assert done.returncode == 0, done.stderr

    woken, _ = await _woken_by(store, create)
    assert woken is True
    assert (await store.claim_next(AGENT)) is not None


# -- a real worker process -------------------------------------------------------------------------------

_WORKER = """
import sys, anyio
from agentlife._runtime._worker import ShellOptions, Worker, WorkerOptions
from agents.worker_agent import WorkerAgent
options = WorkerOptions(
    idle_timeout=600.0,
    poll_interval=600.0,
    max_poll_interval=600.0,
    max_jobs=1,
    shell=ShellOptions(probes=False),
)
sys.exit(anyio.run(Worker(WorkerAgent, options=options).run))
"""


def test_an_idle_worker_process_picks_a_new_job_up_without_polling(tmp_path: Path, postgres_url: str) -> None:
    """The worker polls every 600 s: the job can only have run this soon because the create woke it."""
    traces = tmp_path / "traces"
    traces.mkdir()
    env = agent_env(tmp_path / "data", WORKER_DIR=str(traces), AGENTLIFE_DATABASE_URL=postgres_url)
    assert run_cli("db", "init", env=env).returncode == 0
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        _await_ready(worker)
        made = run_cli("job", "create", "worker-agent", "--id", "instant", env=env)
        assert made.returncode == 0, made.stderr
        out, _ = worker.communicate(timeout=120)  # max_jobs=1: it exits once the job is done
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, out.decode(errors="replace")[-3000:]
    shown = run_cli("job", "show", "instant", env=env)
    assert "COMPLETED" in shown.stdout, shown.stdout
    steps = (traces / "steps").read_text().split("\n")
    assert [line.split()[:2] for line in steps if line] == [["instant", "1"], ["instant", "1"]]


def _await_ready(worker: subprocess.Popen[bytes]) -> None:
    """Read the worker's log until it says it is ready (so the job is created while it is idle)."""
    assert worker.stdout is not None
    for line in iter(worker.stdout.readline, b""):
        if b"worker ready" in line:
            return
    raise AssertionError("the worker exited before it was ready")
