"""An agent for the observability end-to-end tests: a plan of steps the test drives through marker files.

``OBS_PLAN`` holds one entry per step, comma-separated; the step of the last entry returns ``Done``. An entry
is one or more actions joined by ``+``:

- ``gate``: a read-only tool touches ``at-{step}`` and waits until the test creates ``go-{step}``;
- ``block:S``: touches ``at-{step}``, blocks the event loop with ``time.sleep(S)``, touches ``after-{step}``;
- ``llm``: one scripted LLM call;
- ``tool``: one quick side-effecting tool call;
- ``fail``: a tool raising with the planted secrets in its message (the step catches it);
- ``crash``: the step raises with the planted secrets in its message;
- ``sleep:S``: ``anyio.sleep(S)``.

Marker files live in ``TEST_MARKER_DIR``; every action touches ``done-{step}`` when the step ends.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from agentlife import AgentProcess, Done, Job, LLMClient, ScriptedLLM, ScriptedTurn, StepContext, tool


def _marker(name: str) -> Path:
    return Path(os.environ["TEST_MARKER_DIR"], name)


def _secrets_message() -> str:
    """Every planted secret, verbatim: what a careless library or SDK error message would quote."""
    url = os.environ.get("AGENTLIFE_DATABASE_URL", "")
    match = re.search(r"://[^:/@]*:([^@/]+)@", url)
    key = os.environ.get("ANTHROPIC_API_KEY", "")
    token = os.environ.get("AGENTLIFE_CONTROL_PLANE_TOKEN", "")
    password = match.group(1) if match else ""
    return f"cannot reach {url} (password {password}) with key {key} and token {token}"


@tool(side_effects=False, timeout=30)
async def gate(step: int) -> str:
    _marker(f"at-{step}").touch()
    while not _marker(f"go-{step}").exists():
        await anyio.sleep(0.01)
    return f"passed {step}"


@tool(side_effects=True)
async def effect(step: int) -> str:
    return f"effect {step}"


@tool(side_effects=True)
async def leaky(step: int) -> str:
    raise RuntimeError(f"tool failed in step {step}: {_secrets_message()}")


class ObsAgent(AgentProcess):
    """Runs ``OBS_PLAN`` (see the module docstring)."""

    agent_id = "obs-agent"

    def memory_query(self, job: Job, checkpoint: Mapping[str, Any] | None) -> str | None:
        return "what went wrong last time"  # always query, so AGENTLIFE_QDRANT_URL is always used

    def make_llm(self) -> LLMClient:
        return ScriptedLLM([ScriptedTurn.text("ok", chunks=2)], cycle=True)

    async def step(self, ctx: StepContext) -> Done | None:
        plan = os.environ["OBS_PLAN"].split(",")
        for action in plan[ctx.step].split("+"):
            name, _, arg = action.partition(":")
            if name == "gate":
                await ctx.call_tool(gate, step=ctx.step)
            elif name == "block":
                _marker(f"at-{ctx.step}").touch()
                time.sleep(float(arg))  # on purpose: a step that blocks the event loop
                _marker(f"after-{ctx.step}").touch()
            elif name == "llm":
                await ctx.llm.complete(
                    model="claude-sonnet-4-5", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
                )
            elif name == "tool":
                await ctx.call_tool(effect, step=ctx.step)
            elif name == "fail":
                try:
                    await ctx.call_tool(leaky, step=ctx.step)
                except Exception:
                    ctx.state["failed_tools"] = ctx.state.get("failed_tools", 0) + 1
            elif name == "crash":
                raise RuntimeError(f"step {ctx.step} crashed: {_secrets_message()}")
            elif name == "sleep":
                await anyio.sleep(float(arg))
            else:
                raise ValueError(f"unknown OBS_PLAN action {action!r}")
        _marker(f"done-{ctx.step}").touch()
        return Done(result={"steps": ctx.step + 1}) if ctx.step + 1 >= len(plan) else None
