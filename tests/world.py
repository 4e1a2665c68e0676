"""One test's store, data dir and trace files, and the commands real processes run against them.

Shared by the end-to-end tests of approvals, waits and events: ``db_url`` runs a test on SQLite and on the
suite's PostgreSQL, ``procs`` kills what a failed test left running, and `World` drives ``python -m
agentlife run|job`` and reads the rows those processes wrote through a store opened for the read.
"""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from agentlife.stores import CheckpointStore, JobRecord, store_from_url
from procs import agent_env, cli_in_process, spawn

T = TypeVar("T")


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


def init_schema(url: str) -> None:
    """What ``db init`` does, in this process: the command itself is tested on its own (test_process,
    test_job_cli); a Python process per test only to make the tables cost a third of a second each."""

    async def init() -> None:
        store = store_from_url(url)
        await store.open()
        try:
            await store.init_schema()
        finally:
            await store.close()

    anyio.run(init)


class World:
    """A test's database (its schema made as ``db init`` makes it), its data dir and its agents' traces.

    Args:
        tmp_path: the test's directory.
        url: the store.
        trace_variable: the environment variable that tells the test agents where to write their traces.
        target: the agent class ``run`` starts by default.
        env: more environment for every process.
    """

    def __init__(self, tmp_path: Path, url: str, *, trace_variable: str, target: str, **env: str) -> None:
        self.url = url
        self.traces = tmp_path / "traces"
        self.traces.mkdir()
        self.data_dir = tmp_path / "data"
        self.target = target
        self.extra = {trace_variable: str(self.traces), **env}
        init_schema(url)

    def env(self, *, pod: str | None = None, **extra: str) -> dict[str, str]:
        """The environment of a process; ``pod`` names another data dir (its disk), made on first use."""
        return agent_env(self.pod_dir(pod), AGENTLIFE_DATABASE_URL=self.url, **{**self.extra, **extra})

    def pod_dir(self, pod: str | None) -> Path:
        """The data dir of ``pod`` (None: the first pod's, ``data_dir``): a pod's own disk, empty at first."""
        return self.data_dir if pod is None else self.data_dir.with_name(f"pod-{pod}")

    def session_dirs(self, job_id: str) -> list[Path]:
        """The job's session directories on every pod's disk."""
        return [d / "sessions" / job_id for d in (self.data_dir, *self.data_dir.parent.glob("pod-*"))]

    def job(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``job ARGS`` as the command line runs it, in this process (`cli_in_process`): these tests are of
        the jobs the commands act on; the command as a process is tested on its own (test_job_cli)."""
        return cli_in_process("job", *args, env=self.env())

    def create(self, job_id: str, agent: str) -> None:
        """A PENDING job without a payload, made in this process as ``job create`` makes it (that command is
        tested on its own in test_job_cli): one Python process fewer per test."""
        self.read(lambda store: store.create_job(job_id, agent, None))

    def run(
        self, job_id: str, target: str | None = None, *, pod: str | None = None, **env: str
    ) -> subprocess.Popen[bytes]:
        """``run`` the job, on ``pod``'s disk (the first pod's by default)."""
        return spawn(target or self.target, self.env(pod=pod, **env), "--job-id", job_id)

    def finish(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> tuple[int, str]:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, (out + err).decode(errors="replace")

    def lines(self, name: str) -> list[str]:
        path = self.traces / name
        return path.read_text().splitlines() if path.exists() else []

    def read(self, read: Callable[[CheckpointStore], Awaitable[T | None]]) -> T:
        """``read(store)`` on a store opened for the call; the value must be there."""

        async def go() -> T | None:
            store = store_from_url(self.url)
            await store.open()
            try:
                return await read(store)
            finally:
                await store.close()

        value = anyio.run(go)
        assert value is not None
        return value

    def row(self, job_id: str) -> JobRecord:
        return self.read(lambda store: store.get_job(job_id))
