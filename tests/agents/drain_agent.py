"""Agents driven by real-process tests through environment variables."""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from agentlife import AgentProcess, Done, StepContext, tool


def _marker(name: str) -> None:
    directory = os.environ.get("TEST_MARKER_DIR")
    if directory:
        Path(directory, name).touch()


@tool(side_effects=True)
async def slow_tool(invocation_id: str) -> str:
    # How long the tool takes is the environment's doing, not an argument: a resumed attempt makes the
    # same call (same digest) however fast the tool now is.
    _marker(f"tool-started-{invocation_id.replace('/', '_')}")
    await anyio.sleep(float(os.environ.get("TEST_TOOL_SECONDS", "0")))
    _marker(f"tool-finished-{invocation_id.replace('/', '_')}")
    return invocation_id


class DrainAgent(AgentProcess):
    """Steps 0..N-1; in step TOOL_STEP it calls slow_tool(TOOL_SECONDS); other steps take STEP_SECONDS."""

    agent_id = "drain-agent"

    async def step(self, ctx: StepContext) -> Done | None:
        total = int(os.environ.get("TEST_STEPS", "5"))
        tool_step = int(os.environ.get("TEST_TOOL_STEP", "-1"))
        ctx.state.setdefault("done_steps", []).append(ctx.step)
        if ctx.step == tool_step:
            await ctx.call_tool(slow_tool)
        else:
            await anyio.sleep(float(os.environ.get("TEST_STEP_SECONDS", "0.01")))
        _marker(f"step-{ctx.step}-done")
        if ctx.step + 1 >= total:
            return Done(result={"steps": ctx.state["done_steps"]})
        return None


class CrashAgent(AgentProcess):
    agent_id = "crash-agent"

    async def step(self, ctx: StepContext) -> Done | None:
        if ctx.step == 1:
            raise RuntimeError("boom in step 1 " + os.environ.get("TEST_SECRET_IN_ERROR", ""))
        return None


class NotAnAgent:
    pass
