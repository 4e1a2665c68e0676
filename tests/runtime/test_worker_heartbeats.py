"""With ``--concurrency`` above 1, each job's SSE heartbeat carries its own job's state and step.

An in-process worker running two jobs at once on a real SQLite store, the `ControlPlaneStub` receiving the
real SSE streams: one job is held at step 3, the other at step 1, and every heartbeat each stream sends from
then on names its own job's step and ``EXECUTING`` (the process's own fields say READY and no step).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import ClassVar

import anyio
import pytest

from agentlife import AgentProcess, Done, StepContext
from agentlife._exitcode import ExitCode
from agentlife._runtime._worker import ShellOptions, Worker, WorkerOptions
from agentlife.constants import Constants
from agentlife.stores import SQLiteStore
from agentlife.testing import ControlPlaneStub

pytestmark = pytest.mark.anyio

AGENT = "beat-agent"
TOKEN = "cp-token-for-heartbeats-0123456789"
#: The step each job holds at until released.
HOLD_AT = {"a": 3, "b": 1}


class BeatAgent(AgentProcess):
    """Steps quickly to its job's `HOLD_AT` step, waits there until released, then ends."""

    agent_id = AGENT
    holding: ClassVar[set[str]] = set()
    release: ClassVar[anyio.Event | None] = None

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.step < HOLD_AT[ctx.job.id]:
            return None
        type(self).holding.add(ctx.job.id)
        assert self.release is not None
        await self.release.wait()
        return Done(result="ok")


async def test_each_concurrent_jobs_heartbeat_carries_its_own_state_and_step(tmp_path: Path) -> None:
    db = tmp_path / "agentlife.db"
    store = SQLiteStore(db)
    await store.open()
    await store.init_schema()
    for job_id in HOLD_AT:
        await store.create_job(job_id, AGENT, {})
    await store.close()
    BeatAgent.holding, BeatAgent.release = set(), anyio.Event()
    constants = Constants().scaled(0.01)  # an SSE heartbeat every 0.15 s
    async with ControlPlaneStub(token=TOKEN) as plane:
        env = {
            "AGENTLIFE_DATA_DIR": str(tmp_path / "data"),
            "AGENTLIFE_DATABASE_URL": f"sqlite:///{db}",
            "AGENTLIFE_HEALTH_PORT": "off",
            "AGENTLIFE_CONTROL_PLANE_URL": plane.url,
            "AGENTLIFE_CONTROL_PLANE_TOKEN": TOKEN,
        }
        options = WorkerOptions(
            idle_timeout=600.0,
            max_jobs=2,
            poll_interval=0.01,
            max_poll_interval=0.05,
            constants=constants,
            shell=ShellOptions(handle_signals=False, hard_exit=False, probes=False, log_stream=io.StringIO()),
            concurrency=2,
        )
        worker = Worker(BeatAgent, env=env, options=options)
        code = -1

        async def run() -> None:
            nonlocal code
            code = await worker.run()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(run)
                while BeatAgent.holding != set(HOLD_AT):
                    await anyio.sleep(0.01)
                since = len(plane.events)
                for job_id in HOLD_AT:  # two heartbeats of each job while both are held
                    after = since
                    for _ in range(2):
                        beat = await plane.wait_for(
                            lambda e, j=job_id: e.data.get("jobId") == j,  # type: ignore[misc]
                            event="heartbeat",
                            after=after,
                        )
                        after = plane.events.index(beat) + 1
                held = [e.data for e in plane.events[since:] if e.event == "heartbeat"]
                BeatAgent.release.set()
    assert code == ExitCode.DONE
    seen = {(b["jobId"], b["lifecycleState"], b["currentStep"]) for b in held}
    assert seen == {("a", "EXECUTING", 3), ("b", "EXECUTING", 1)}
    # The worker's own board fields (what the heartbeat read before) name neither job's step.
    snap = worker.board.snapshot()
    assert snap.step is None
