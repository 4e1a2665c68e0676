"""Agents with tools from the MCP test server (``tests/mcp_test_server.py``), for real-process tests.

``MCP_STATE`` is the server's state directory; ``MCP_VERIFY=1`` gives ``create_issue`` a ``verify`` that
looks the issue up by its idempotency key (the invocation id the server got in ``_meta``). ``MCP_URL``:
the server is that Streamable HTTP endpoint instead of a child process; ``MCP_TIMEOUT``: seconds for
``create_issue``; ``MCP_GRANDCHILD=1``: the stdio server leaves a child in its process group.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

from agentlife import NOT_DONE, AgentProcess, Done, MCPServer, StepContext, tool

SERVER = str(Path(__file__).resolve().parent.parent / "mcp_test_server.py")


async def find_issue(invocation_id: str) -> Any:
    effects = Path(os.environ["MCP_STATE"]) / "effects.jsonl"
    for line in effects.read_text().splitlines() if effects.exists() else []:
        record = json.loads(line)
        if record["key"] == invocation_id:
            return {"created": record["title"]}
    return NOT_DONE


def tracker() -> MCPServer:
    state = os.environ.get("MCP_STATE", "/nonexistent")
    extra = ["--grandchild"] if os.environ.get("MCP_GRANDCHILD") == "1" else []
    url = os.environ.get("MCP_URL")
    server = MCPServer.http(url) if url else MCPServer.stdio(sys.executable, [SERVER, state, *extra])
    timeout = float(os.environ["MCP_TIMEOUT"]) if "MCP_TIMEOUT" in os.environ else None
    if os.environ.get("MCP_VERIFY") == "1":
        server = server.with_tool("create_issue", verify=find_issue, timeout=timeout)
    return server


class IssueAgent(AgentProcess):
    """Step 0 creates an issue through MCP, step 1 reads it back, then done."""

    agent_id = "mcp-issues"
    mcp_servers: ClassVar[Any] = (tracker(),)

    async def step(self, ctx: StepContext) -> Done | None:
        server = self.mcp_servers[0]
        if ctx.step == 0:
            ctx.state["created"] = await ctx.call_tool(server.tool("create_issue"), title="disk full")
            return None
        found = await ctx.call_tool(server.tool("lookup"), key=f"{ctx.job.id}/0/0")
        return Done(result={"created": ctx.state["created"], "found": found})


class SlowAgent(AgentProcess):
    """One step that waits on a slow read-only MCP call (for SIGTERM during it)."""

    agent_id = "mcp-slow"
    mcp_servers: ClassVar[Any] = (tracker(),)

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(self.mcp_servers[0].tool("slow"), seconds=60)
        return Done(result="slept")


def stubborn_server() -> MCPServer:
    state = os.environ.get("MCP_STATE", "/nonexistent")
    return MCPServer.stdio(sys.executable, [SERVER, state, "--stubborn"])


class StubbornServerAgent(AgentProcess):
    """Its server ignores SIGTERM and the end of its input; its step then blocks the event loop.

    ``MCP_BLOCK=1``: after one call, a tool sleeps on the loop itself, so a drain can only end by the hard
    exit. Otherwise the step waits on a slow MCP call (for a SIGKILL during it).
    """

    agent_id = "mcp-stubborn"
    mcp_servers: ClassVar[Any] = (stubborn_server(),)

    async def step(self, ctx: StepContext) -> Done | None:
        server = self.mcp_servers[0]
        await ctx.call_tool(server.tool("lookup"), key="k")
        if os.environ.get("MCP_BLOCK") == "1":
            await ctx.call_tool(block_the_loop)
        await ctx.call_tool(server.tool("slow"), seconds=60)
        return Done(result="never")


@tool(side_effects=False)
async def block_the_loop() -> str:
    """Sleeps on the event loop itself: nothing, not even cancellation, runs until it returns."""
    (Path(os.environ["MCP_STATE"]) / "blocking").write_text("1")
    time.sleep(60)  # deliberately blocking
    return "blocked"
