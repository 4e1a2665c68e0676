"""Agents whose code misbehaves the ways real code does: swallowed cancellation, BaseExceptions from tools."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from agentlife import AgentProcess, Done, StepContext, tool


class _Custom(BaseException):
    pass


def _raise(kind: str) -> Any:
    if kind == "systemexit":
        raise SystemExit(2)  # a click command run in-process
    if kind == "keyboardinterrupt":
        raise KeyboardInterrupt
    if kind == "generatorexit":
        raise GeneratorExit
    if kind == "cancelled":
        raise asyncio.CancelledError("the tool's own")
    raise _Custom("custom")


@tool(side_effects=False)
async def hostile_async() -> Any:
    return _raise(os.environ["HOSTILE_KIND"])


@tool(side_effects=False)
def hostile_sync() -> Any:
    return _raise(os.environ["HOSTILE_KIND"])


class BaseExceptionToolAgent(AgentProcess):
    """Step 0 calls a tool that raises ``HOSTILE_KIND`` (``HOSTILE_SYNC=1``: a sync tool on a thread)."""

    agent_id = "hostile"

    async def step(self, ctx: StepContext) -> Done | None:
        fn = hostile_sync if os.environ.get("HOSTILE_SYNC") == "1" else hostile_async
        await ctx.call_tool(fn)
        return Done(result="unreachable")


async def _swallow_cancellation_forever() -> None:
    while True:
        try:  # noqa: SIM105 - written the way such code is written
            await asyncio.sleep(0.05)
        except BaseException:
            pass


class StrayTaskAgent(AgentProcess):
    """Starts a task outside any task group that never lets itself be cancelled, then completes."""

    agent_id = "stray"
    _tasks: set[asyncio.Task[None]] = set()

    async def step(self, ctx: StepContext) -> Done | None:
        self._tasks.add(asyncio.get_running_loop().create_task(_swallow_cancellation_forever()))
        return Done(result="done")
