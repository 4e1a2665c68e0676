"""A ten-step agent for ``job rewind``: each step makes one side effect and appends one message.

The side-effecting tool appends ``invocation_id label`` to ``$REWIND_DIR/effects`` (fsynced) and returns
``label:step``; ``REWIND_LABEL`` is "the deploy" (a changed prompt or payload behaviour), read when the
tool runs, so a result replayed from a record shows the label of the attempt that recorded it. The state
keeps every step's result and the conversation's length at each step's start. With ``REWIND_HANG_AT=N``
step N waits after its effect for the test's SIGKILL (``$REWIND_DIR/hanging`` says it got there); with
``REWIND_FAIL_AT=N`` the job ends FAILED after step N ("it went wrong there").
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio

from agentlife import AgentProcess, Done, LLMClient, ScriptedLLM, StepContext, tool

STEPS = 10


def _dir() -> Path:
    return Path(os.environ["REWIND_DIR"])


@tool
async def record_effect(step: int, invocation_id: str) -> str:
    """Make one side effect in the outside world (a line in the effects file)."""
    label = os.environ.get("REWIND_LABEL", "v1")
    fd = os.open(_dir() / "effects", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{invocation_id} {label}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return f"{label}:{step}"


class RewindAgent(AgentProcess):
    agent_id = "rewind"

    def make_llm(self) -> LLMClient:
        return ScriptedLLM([])

    async def step(self, ctx: StepContext) -> Done | None:
        ctx.state.setdefault("results", []).append(None)
        ctx.state.setdefault("seen", []).append(len(ctx.conversation))
        result = await ctx.call_tool(record_effect, step=ctx.step)
        ctx.state["results"][-1] = result
        ctx.conversation.append({"role": "user", "content": f"step {ctx.step}: {result}"})
        if ctx.step == int(os.environ.get("REWIND_HANG_AT", "-1")):
            (_dir() / "hanging").touch()
            await anyio.sleep(3600)
        if ctx.step == int(os.environ.get("REWIND_FAIL_AT", "-1")):
            return Done(status="FAILED", reason=f"went wrong at step {ctx.step}")
        if ctx.step >= STEPS - 1:
            return Done(result={"results": ctx.state["results"], "seen": ctx.state["seen"]})
        return None
