"""Agents used by the benchmarks."""

from __future__ import annotations

import os

import anyio

from agentlife import AgentProcess, Done, StepContext


class IdleAgent(AgentProcess):
    """Never finishes; each step is a short wait, so a SIGTERM finds it (almost always) between steps."""

    agent_id = "idle"

    async def step(self, ctx: StepContext) -> Done | None:
        await anyio.sleep(0.005)
        return None


class QuickAgent(AgentProcess):
    """One step that does nothing: a job whose cost is all start and finish."""

    agent_id = "quick"

    async def step(self, ctx: StepContext) -> Done | None:
        return Done(result={"ok": True})


class WaitingAgent(AgentProcess):
    """One step that waits on the network for 0.2 s (a sleep): an IO-bound job."""

    agent_id = "waiting"

    async def step(self, ctx: StepContext) -> Done | None:
        await anyio.sleep(0.2)
        return Done(result={"ok": True})


class ModelBoundAgent(AgentProcess):
    """One step that waits on a model for ``BENCH_MODEL_SECONDS`` (default 1 s, a sleep): latency-bound."""

    agent_id = "model-bound"

    async def step(self, ctx: StepContext) -> Done | None:
        await anyio.sleep(float(os.environ.get("BENCH_MODEL_SECONDS", "1.0")))
        return Done()


class FirstCallAgent(AgentProcess):
    """One step that makes one model call through the default ``make_llm()``: spawn -> first request."""

    agent_id = "first-call"

    async def step(self, ctx: StepContext) -> Done | None:
        reply = await ctx.llm.complete(
            model="claude-sonnet-agentlife-bench", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
        return Done(result={"text": reply.text})
