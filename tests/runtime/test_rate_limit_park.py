"""A job whose model call must wait past ``park_after_seconds`` for the fleet's capacity parks, and resumes.

In-process, through the whole engine: the limit from the environment, the process's limiter, the step's
call, the park (the row WAITING, what it waits for), and the next attempt making the call once the
capacity is back.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from agentlife import AgentProcess, Done, LLMClient, ScriptedLLM, ScriptedTurn, StepContext
from agentlife.stores import SQLiteStore
from agentlife.testing import AgentHarness

pytestmark = pytest.mark.anyio


class OneCall(AgentProcess):
    agent_id = "one-call"

    def make_llm(self) -> LLMClient:
        return ScriptedLLM([ScriptedTurn.text("answered")])

    async def step(self, ctx: StepContext) -> Done:
        reply = await ctx.llm.complete(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        return Done(result=reply.text)


async def test_a_call_that_must_wait_past_park_after_parks_the_job_and_the_next_attempt_calls(
    agent_harness: AgentHarness,
) -> None:
    env = {"AGENTLIFE_RATE_LIMIT_RPM": "600"}
    store = SQLiteStore(Path(agent_harness.database_url.removeprefix("sqlite:///")))
    await store.open()
    await store.pause_rate_bucket("anthropic", (600, None, None), time.time() + 1.0)  # park_after: 0.3 s
    parked = await agent_harness.run(OneCall(), env=env)
    wait = await store.get_wait("job-1")
    await store.close()
    assert parked.exit_code == 0 and parked.job is not None and parked.job.status == "WAITING"
    assert wait is not None and wait.waiting_for["kind"] == "rate_limit"
    assert wait.waiting_for["bucket"] == "anthropic" and wait.waiting_for["reason"] == "paused"
    assert "LLM_COMPLETED" not in parked.journal_types()
    await anyio.sleep(1.1)
    resumed = await agent_harness.run(OneCall(), env=env)
    assert resumed.exit_code == 0 and resumed.job is not None and resumed.job.status == "COMPLETED"
    assert resumed.job.result == "answered"
