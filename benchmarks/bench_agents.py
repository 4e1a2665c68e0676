"""Agents used by the benchmarks."""

from __future__ import annotations

import anyio

from agentlife import AgentProcess, Done, StepContext


class IdleAgent(AgentProcess):
    """Never finishes; each step is a short wait, so a SIGTERM finds it (almost always) between steps."""

    agent_id = "idle"

    async def step(self, ctx: StepContext) -> Done | None:
        await anyio.sleep(0.005)
        return None
