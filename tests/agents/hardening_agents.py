"""Agents for the hardening tests (tests/e2e/test_run_refusals.py): masking, claims, import-time secrets."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

from agentlife import AgentProcess, Done, StepContext, tool


def _effect(name: str) -> None:
    """Count a side effect in ``TEST_MARKER_DIR/name`` (one line per effect)."""
    directory = os.environ.get("TEST_MARKER_DIR")
    if directory:
        with open(Path(directory, name), "a") as f:
            f.write(f"{os.getpid()}\n")


@tool(side_effects=True)
async def cyclic_effect() -> Any:
    """Does its effect, then returns a result that refers to itself."""
    _effect("cyclic")
    result: dict[str, Any] = {"token": os.environ.get("AGENTLIFE_CONTROL_PLANE_TOKEN", "")}
    result["self"] = result
    return result


@tool(side_effects=True)
async def slow_effect(seconds: float) -> str:
    _effect("slow")
    await anyio.sleep(seconds)
    return "done"


class CyclicResultAgent(AgentProcess):
    """One step: a side-effecting tool whose result is cyclic, then Done."""

    agent_id = "cyclic-agent"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(cyclic_effect)
        return Done(result={"ok": True})


class SlowEffectAgent(AgentProcess):
    """One step: a side effect that takes ``TEST_TOOL_SECONDS``, then Done."""

    agent_id = "slow-effect"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(slow_effect, seconds=float(os.environ.get("TEST_TOOL_SECONDS", "0")))
        return Done(result={"ok": True})


class LeakyInitAgent(AgentProcess):
    """Its ``__init__`` quotes a token from the environment in its error."""

    agent_id = "leaky-init"

    def __init__(self) -> None:
        super().__init__()
        raise RuntimeError(f"cannot log in with {os.environ.get('AGENTLIFE_CONTROL_PLANE_TOKEN')}")

    async def step(self, ctx: StepContext) -> Done | None:  # pragma: no cover - never constructed
        return Done()


if os.environ.get("TEST_LEAK_AT_IMPORT"):
    raise ImportError(f"bad token {os.environ.get('AGENTLIFE_CONTROL_PLANE_TOKEN')}")
