"""`agentlife.Client` in this process, jobs run by real ``python -m agentlife worker`` processes: a start's
result, a result that outlives a SIGKILLed worker and returns the retried job's outcome, a cancel of a job a
worker is running, a FAILED job's typed error. One worker process drives several checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from agentlife import Client, JobCancelled, JobFailed
from procs import REPO, agent_env, wait_for
from world import init_schema

TARGET = "agents.client_agent:ClientAgent"
AGENT = "client-agent"


def worker(tmp_path: Path, url: str, *args: str) -> subprocess.Popen[bytes]:
    env = agent_env(tmp_path / "data", CLIENT_DIR=str(tmp_path), AGENTLIFE_DATABASE_URL=url)
    return subprocess.Popen(
        [sys.executable, "-m", "agentlife", "worker", TARGET, *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_results_through_real_workers_including_one_sigkilled_mid_job(
    tmp_path: Path, db_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    init_schema(db_url)
    first = worker(tmp_path, db_url)
    procs.append(first)

    async def drive() -> None:
        async with await Client.connect(db_url) as client:
            job = await client.start(AGENT, {"echo": "hi"}, job_id="plain")
            assert await client.result(job.job_id, timeout=60) == {"echo": "hi", "attempt": 1}

            await client.start(AGENT, {"fail": "no luck"}, job_id="fails")
            with pytest.raises(JobFailed) as failed:
                await client.result("fails", timeout=60)
            assert type(failed.value) is JobFailed and failed.value.status == "FAILED"

            await client.start(AGENT, {"hold": True}, job_id="stopped")
            await anyio.to_thread.run_sync(wait_for, tmp_path / "held-stopped-1")
            await client.cancel("stopped", "the user left")
            (tmp_path / "go-stopped").touch()  # the worker carries on, and is fenced out
            with pytest.raises(JobCancelled, match="the user left"):
                await client.result("stopped", timeout=60)

            await client.start(AGENT, {"hold": True, "echo": "survived"}, job_id="killed")
            await anyio.to_thread.run_sync(wait_for, tmp_path / "held-killed-1")
            answers: list[object] = []
            async with anyio.create_task_group() as tg:

                async def wait() -> None:
                    answers.append(await client.result("killed", timeout=120))

                tg.start_soon(wait)
                first.kill()  # an OOM kill: the row stays RUNNING under a dead owner
                await anyio.to_thread.run_sync(first.communicate)
                again = await client.start(AGENT, {"hold": True, "echo": "survived"}, job_id="killed")
                assert again.job_id == "killed"  # a retried start is the same job
                (tmp_path / "go-killed").touch()
                # The dead-owner check hands the row back once its heartbeat is one interval old.
                procs.append(worker(tmp_path, db_url, "--time-scale", "0.1"))
            assert answers == [{"echo": "survived", "attempt": 2}]
            row = await client.get("killed")
            assert [e.get("error_class") for e in row.errors] == ["OwnerGone"]
            assert len((await client.list(limit=10)).jobs) == 4

    anyio.run(drive)
