"""Agents for what the journal refuses and what it left pending (tests/e2e/test_journal_refusals.py).

Every effect is one line appended to ``$TEST_MARKER_DIR/effects``, so a test counts runs across processes.
``TEST_KIND`` picks what the side-effecting tool returns: ``cycle``, ``deep`` (300 levels) or
``surrogate`` (a string with a lone surrogate). ``TEST_HANG_ATTEMPT=N`` makes attempt N wait, after the
interesting part, for the test's SIGKILL.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio

from agentlife import AgentProcess, Done, StepContext, UnreplayableValue, tool


def _mark(name: str, text: str = "") -> None:
    with open(Path(os.environ["TEST_MARKER_DIR"], name), "a") as f:
        f.write(f"{text or os.getpid()}\n")


def unkeepable(kind: str) -> Any:
    """A value the journal cannot give back exactly."""
    if kind == "cycle":
        cyclic: dict[str, Any] = {"n": 1}
        cyclic["self"] = cyclic
        return cyclic
    if kind == "deep":
        deep: list[Any] = []
        for _ in range(300):
            deep = [deep]
        return deep
    return {"text": "caf\ud800"}


async def _hang_if_asked(ctx: StepContext) -> None:
    if os.environ.get("TEST_HANG_ATTEMPT") == str(ctx.job.attempt):
        _mark("hanging")
        await anyio.sleep(3600)


@tool(side_effects=True)
async def unkeepable_effect(kind: str) -> Any:
    """Does its effect, then returns what the journal cannot hold exactly."""
    _mark("effects")
    return unkeepable(kind)


class RefusedResultAgent(AgentProcess):
    """One step: the side-effecting tool; with ``TEST_CATCH=1`` the step records the refusal and ends."""

    agent_id = "refused-result"

    async def step(self, ctx: StepContext) -> Done | None:
        try:
            await ctx.call_tool(unkeepable_effect, kind=os.environ["TEST_KIND"])
        except UnreplayableValue as exc:
            if os.environ.get("TEST_CATCH") != "1":
                raise
            _mark("errors", repr(str(exc)))
            await _hang_if_asked(ctx)
            return Done(result={"error": str(exc)})
        return Done(result={"error": None})


@tool(side_effects=False)
async def lookup(asked_at: float) -> str:
    """Read-only; its argument differs on every attempt."""
    _mark("lookups")
    return "found"


@tool(side_effects=True)
async def charge(asked_at: float) -> str:
    """Side-effecting, without verify; its argument differs on every attempt."""
    _mark("effects")
    return "charged"


class PendingCallAgent(AgentProcess):
    """One step: ``TEST_TOOL`` (``lookup`` or ``charge``) with the time; attempt ``TEST_HANG_ATTEMPT``
    hangs inside the call, so the call is journaled as started and never finished."""

    agent_id = "pending-call"

    async def step(self, ctx: StepContext) -> Done | None:
        fn = charge if os.environ["TEST_TOOL"] == "charge" else lookup
        if os.environ.get("TEST_HANG_ATTEMPT") == str(ctx.job.attempt):
            fn = _hanging(fn)
        found = await ctx.call_tool(fn, asked_at=time.time())
        return Done(result={"found": found, "attempt": ctx.job.attempt})


def _hanging(fn: Any) -> Any:
    """The same tool (name, side effects), hanging after its effect until the test's SIGKILL."""

    async def hang(asked_at: float) -> str:
        await fn.fn(asked_at=asked_at)
        _mark("hanging")
        await anyio.sleep(3600)
        return "never"

    return tool(name=fn.name, side_effects=fn.side_effects)(hang)


class ChatAgent(AgentProcess):
    """Appends one message per step; attempt 1 crashes at step ``TEST_CRASH_AT`` (its checkpoint before)."""

    agent_id = "chat"

    async def step(self, ctx: StepContext) -> Done | None:
        ctx.conversation.append({"role": "user", "content": f"turn {ctx.step}"})
        if ctx.job.attempt == 1 and ctx.step == int(os.environ.get("TEST_CRASH_AT", "3")):
            raise RuntimeError("crash after three checkpoints")
        return Done(result={"messages": len(ctx.conversation)}) if ctx.step == 4 else None


@tool(side_effects=True)
async def garbled() -> str:
    """Fails with a message holding a lone surrogate (text decoded with ``surrogateescape``)."""
    raise ValueError(b"bad byte \xff here".decode("utf-8", "surrogateescape"))


class GarbledErrorAgent(AgentProcess):
    """One step: a tool whose exception message orjson cannot write."""

    agent_id = "garbled"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(garbled)
        return Done()
