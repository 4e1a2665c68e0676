"""An agent for SIGKILL crash-resume tests: every external effect is appended to files the test reads.

Each step makes one LLM call (a client that records every call it really makes) and one side-effecting
tool call (which records every time it really runs). ``KILL_VERIFY=1`` gives the tool a ``verify``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from agentlife import (
    NOT_DONE,
    AgentProcess,
    Done,
    LLMClient,
    LLMReply,
    StepContext,
    StreamTimeouts,
    Usage,
    tool,
)


def _append(name: str, line: str) -> None:
    path = Path(os.environ["KILL_LOG_DIR"]) / name
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _effects() -> list[str]:
    path = Path(os.environ["KILL_LOG_DIR"]) / "effects"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


async def _verify(invocation_id: str) -> Any:
    return f"done:{invocation_id}" if invocation_id in _effects() else NOT_DONE


async def _effect(invocation_id: str) -> str:
    await anyio.sleep(0.01)
    _append("effects", f"{invocation_id} {os.environ['AGENTLIFE_ATTEMPT']}")
    await anyio.sleep(0.01)
    return f"done:{invocation_id}"


effect_plain = tool(name="effect")(_effect)
effect_verified = tool(name="effect", verify=_verify)(_effect)


class RecordingLLM:
    """Counts the calls it really makes; replies after a short stream-like pause."""

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        **params: Any,
    ) -> LLMReply:
        tag = str(messages[-1]["content"])
        _append("llm", f"{tag} {os.environ['AGENTLIFE_ATTEMPT']}")
        await anyio.sleep(0.01)
        return LLMReply(text=f"answer to {tag}", usage=Usage(input_tokens=10, output_tokens=5), model=model)

    async def aclose(self) -> None:
        pass


class KillAgent(AgentProcess):
    agent_id = "kill-agent"

    def make_llm(self) -> LLMClient:
        return RecordingLLM()

    async def step(self, ctx: StepContext) -> Done | None:
        reply = await ctx.llm.complete(
            model="m", max_tokens=10, messages=[{"role": "user", "content": f"{ctx.job.id}/{ctx.step}"}]
        )
        spec = effect_verified if os.environ.get("KILL_VERIFY") == "1" else effect_plain
        result = await ctx.call_tool(spec)
        ctx.state.setdefault("steps", []).append([ctx.step, reply.text, result])
        await anyio.sleep(0.005)
        if ctx.step + 1 >= int(os.environ.get("KILL_STEPS", "6")):
            return Done(result={"steps": [s[0] for s in ctx.state["steps"]]})
        return None


@tool(side_effects=False)
async def pause() -> str:
    """Read-only: says it is pausing (``paused-{attempt}``), then waits ``PAUSE_SECONDS``."""
    (Path(os.environ["KILL_LOG_DIR"]) / f"paused-{os.environ['AGENTLIFE_ATTEMPT']}").touch()
    await anyio.sleep(float(os.environ.get("PAUSE_SECONDS", "0.5")))
    return "paused"


class PauseThenEffectAgent(AgentProcess):
    """One step: a read-only pause, then one side-effecting call (no verify), then done."""

    agent_id = "pause-agent"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(pause)
        await ctx.call_tool(effect_plain)
        return Done(result={"done": True})
