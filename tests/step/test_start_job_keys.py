"""``ctx.start_job(..., concurrency_key=, priority=)``: the child row carries them; bad ones fail the step."""

from __future__ import annotations

from typing import Any

import pytest

from agentlife import AgentProcess, Done, StepContext
from agentlife.stores import SQLiteStore
from agentlife.testing import AgentHarness

pytestmark = pytest.mark.anyio


class Starter(AgentProcess):
    agent_id = "starter"

    def __init__(self, **start: Any) -> None:
        super().__init__()
        self.start = start

    async def step(self, ctx: StepContext) -> Done | None:
        handle = await ctx.start_job("child-agent", payload={"n": 1}, **self.start)
        return Done({"child": handle.job_id})


async def _child(harness: AgentHarness, job_id: str) -> Any:
    store = SQLiteStore(harness.data_dir / "agentlife.db")
    await store.open()
    try:
        return await store.get_job(job_id)
    finally:
        await store.close()


async def test_a_child_job_carries_its_key_and_priority(agent_harness: AgentHarness) -> None:
    run = await agent_harness.run(Starter(concurrency_key="tenant-a", priority=5), job_id="p")
    assert run.exit_code == 0, run.logs
    assert run.job is not None and run.job.result is not None
    child = await _child(agent_harness, run.job.result["child"])
    assert (child.concurrency_key, child.priority, child.status) == ("tenant-a", 5, "PENDING")
    plain = await agent_harness.run(Starter(), job_id="q")
    assert plain.job is not None and plain.job.result is not None
    child = await _child(agent_harness, plain.job.result["child"])
    assert (child.concurrency_key, child.priority) == (None, 0)


@pytest.mark.parametrize(
    ("start", "needle"),
    [
        ({"concurrency_key": "a\x07b"}, "ctx.start_job: concurrency_key holds the control character U+0007"),
        ({"concurrency_key": "k" * 10_000}, "ctx.start_job: concurrency_key is 10000 characters long"),
        ({"priority": 10**6}, "ctx.start_job: priority=1000000 is out of range"),
        ({"priority": "high"}, "ctx.start_job: priority must be a whole number"),
    ],
)
async def test_a_bad_key_or_priority_fails_the_step_and_starts_no_child(
    agent_harness: AgentHarness, start: dict[str, Any], needle: str
) -> None:
    run = await agent_harness.run(Starter(**start), job_id="p")
    assert run.exit_code != 0
    assert run.job is not None and run.job.error
    message = str(run.job.error[-1].get("message"))
    assert needle in message and "\n" not in message, message
    store = SQLiteStore(agent_harness.data_dir / "agentlife.db")
    await store.open()
    try:
        assert [row.id for row in await store.list_jobs()] == ["p"]  # no child row
    finally:
        await store.close()
