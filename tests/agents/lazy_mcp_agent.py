"""An agent whose MCP server is made by a property on first access: its module never imports `MCPServer`.

Nothing has loaded agentlife's MCP code when the runtime looks for the agent's servers, so the lookup must
read the property before deciding the agent lists none.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from agentlife import AgentProcess, Done, StepContext

SERVER = str(Path(__file__).resolve().parent.parent / "mcp_test_server.py")


class LazyServerAgent(AgentProcess):
    """Step 0 creates an issue through a server its property makes, then reads it back."""

    agent_id = "mcp-lazy"
    _servers: tuple[Any, ...] = ()

    @property
    def mcp_servers(self) -> tuple[Any, ...]:  # type: ignore[override]
        if not self._servers:
            from agentlife import MCPServer

            self._servers = (MCPServer.stdio(sys.executable, [SERVER, os.environ["MCP_STATE"]]),)
        return self._servers

    async def step(self, ctx: StepContext) -> Done | None:
        server = self.mcp_servers[0]
        created = await ctx.call_tool(server.tool("create_issue"), title="disk full")
        found = await ctx.call_tool(server.tool("lookup"), key=f"{ctx.job.id}/0/0")
        return Done(result={"created": created, "found": found})
