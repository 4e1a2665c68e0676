"""Agents with a restricted call, for the approval tests with real processes (``test_job_approve.py``).

Every trace goes to append-only files in ``APPROVAL_DIR``, written with ``fsync`` so a SIGKILL cannot lose
one: ``effects`` (``invocation_id attempt pid``) each time the restricted ``deploy`` really runs, ``plans``
each time the side-effecting ``plan`` runs, ``model`` one line per model turn the `ToolAgent` gets.

- `Deployer`: step 0 calls ``plan`` (side effects, not restricted), then the restricted ``deploy``, and
  ends with the result; a refused ``deploy`` propagates.
- `SwallowingDeployer`: catches the refusal and returns ``Done`` (COMPLETED) as if nothing happened.
- `ToolDeployer`: a `ToolAgent` whose scripted model asks for ``deploy`` and then ``plan`` in one reply,
  and answers with text once it sees the tool results.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from agentlife import (
    AgentProcess,
    BackgroundOperationRestricted,
    Done,
    LLMClient,
    ScriptedLLM,
    ScriptedTurn,
    StepContext,
    ToolAgent,
    tool,
)


def _append(name: str, line: str) -> None:
    fd = os.open(Path(os.environ["APPROVAL_DIR"]) / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _attempt() -> str:
    return os.environ.get("AGENTLIFE_ATTEMPT", "1")


@tool(side_effects=True)
async def plan(invocation_id: str) -> str:
    """Write down the plan."""
    _append("plans", f"{invocation_id} {_attempt()} {os.getpid()}")
    return "planned"


@tool(side_effects=True, restricted=True)
async def deploy(target: str, invocation_id: str) -> str:
    """Deploy to ``target``.

    Args:
        target: where to deploy.
    """
    _append("effects", f"{invocation_id} {_attempt()} {os.getpid()}")
    return f"deployed {target}"


class Deployer(AgentProcess):
    """Plans, then deploys to prod (restricted)."""

    agent_id = "deployer"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(plan)
        return Done(result={"deployed": await ctx.call_tool(deploy, target="prod")})


class SwallowingDeployer(Deployer):
    """Catches a refused deploy and claims success."""

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(plan)
        try:
            await ctx.call_tool(deploy, target="prod")
        except BackgroundOperationRestricted:
            await ctx.call_tool(plan)  # more work after the refusal: it must not run
            return Done(result={"deployed": "never mind"})
        return Done(result={"deployed": True})


class _CountingLLM(ScriptedLLM):
    async def complete(self, **kwargs: Any) -> Any:
        _append("model", f"turn {_attempt()} {os.getpid()}")
        return await super().complete(**kwargs)


class ToolDeployer(ToolAgent):
    """A model that deploys to prod and, in the same reply, plans; then reports whatever it got back."""

    agent_id = "deployer"
    tools: ClassVar[Any] = (deploy, plan)
    max_turns = 5

    def make_llm(self) -> LLMClient:
        both = ScriptedTurn.reply(
            [
                {"type": "tool_use", "id": "tu_1", "name": "deploy", "input": {"target": "prod"}},
                {"type": "tool_use", "id": "tu_2", "name": "plan", "input": {}},
            ],
            stop_reason="tool_use",
        )
        return _CountingLLM({(0, 0): both, (1, 0): "The deploy was refused, so I stopped. All good."})
