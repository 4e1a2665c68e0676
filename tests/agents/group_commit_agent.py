"""An agent that SIGKILLs itself at a group-commit point: after a step's batched read-only result.

Each of ``GC_STEPS`` steps makes one LLM call (recorded in ``llm``), one side-effecting tool call without
``verify`` (recorded in ``effects``) and one read-only call (recorded in ``reads``). On attempt 1 the step
``GC_KILL_STEP`` kills its own process right after the read-only result, before the step's checkpoint: the
read-only result exists only in the journal's buffer, the side effect's completion was made durable.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentlife import AgentProcess, Done, LLMReply, StepContext, StreamTimeouts, Usage, tool


def _append(name: str, line: str) -> None:
    path = Path(os.environ["GC_LOG_DIR"]) / name
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@tool(name="effect")
async def effect(invocation_id: str) -> str:
    _append("effects", invocation_id)
    return f"done:{invocation_id}"


@tool(name="lookup", side_effects=False)
async def lookup(invocation_id: str) -> str:
    _append("reads", invocation_id)
    return f"read:{invocation_id}"


class CountingLLM:
    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        timeouts: StreamTimeouts | None = None,
        **params: Any,
    ) -> LLMReply:
        _append("llm", str(messages[-1]["content"]))
        return LLMReply(text="ok", usage=Usage(input_tokens=10, output_tokens=5), model=model)

    async def aclose(self) -> None:
        pass


class GroupCommitAgent(AgentProcess):
    agent_id = "group-commit"

    def make_llm(self) -> CountingLLM:
        return CountingLLM()

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.llm.complete(
            model="m", messages=[{"role": "user", "content": f"step {ctx.step}"}], max_tokens=8
        )
        await ctx.call_tool(effect)
        await ctx.call_tool(lookup)
        if str(ctx.step) == os.environ.get("GC_KILL_STEP") and os.environ["AGENTLIFE_ATTEMPT"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        if str(ctx.step) == os.environ.get("GC_RAISE_STEP") and os.environ["AGENTLIFE_ATTEMPT"] == "1":
            raise RuntimeError("the step fails after its calls")
        if ctx.step + 1 >= int(os.environ.get("GC_STEPS", "3")):
            return Done(result={"steps": ctx.step + 1})
        return None
