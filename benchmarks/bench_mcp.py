"""What agentlife adds to an MCP tool call, and what one stdio MCP server adds to start-up.

Per call: one step calls a read-only MCP tool N times through ``ctx.call_tool`` (arguments validated,
journaled, replay-checked, timed out, in a span) against a bare ``ClientSession.call_tool`` loop on the same
kind of server, in the same run (target <= 1.2x). The write-ahead path of a side-effecting tool (two
fsyncs per call) is reported beside it, without a target: its cost is the disk's.

Start-up: the same agent with one stdio server, from ``Runtime.run()`` to READY, next to the server's own
start (spawn, ``initialize``, ``tools/list`` through the bare SDK) measured apart.

Run: python benchmarks/bench_mcp.py  (one JSON object per line)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio

from agentlife import AgentProcess, Done, MCPServer, StepContext
from agentlife.testing import AgentHarness

SERVER = str(Path(__file__).resolve().parent.parent / "tests" / "mcp_test_server.py")
N = 300
ROUNDS = 3


def emit(metric: str, value: float, unit: str, target: str | None, **extra: Any) -> None:
    print(
        json.dumps(
            {
                "bench": "mcp",
                "metric": metric,
                "value": round(value, 3),
                "unit": unit,
                "target": target,
                **extra,
            }
        ),
        flush=True,
    )


async def bare_calls(state: Path, tool: str, args: dict[str, Any]) -> tuple[float, float]:
    """(seconds per call, seconds to start) through the SDK alone."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=[SERVER, str(state)])
    started = time.perf_counter()
    async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
        await session.initialize()
        await session.list_tools()
        start = time.perf_counter() - started
        for _ in range(20):
            await session.call_tool(tool, args)
        t = time.perf_counter()
        for i in range(N):
            await session.call_tool(tool, {**args, **({"title": f"t{i}"} if "title" in args else {})})
        return (time.perf_counter() - t) / N, start


def agent_for(state: Path, tool: str, args: dict[str, Any]) -> AgentProcess:
    server = MCPServer.stdio(sys.executable, [SERVER, str(state)])

    class Bench(AgentProcess):
        agent_id = "bench-mcp"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            ref = server.tool(tool)
            for _ in range(20):
                await ctx.call_tool(ref, **args)
            t = time.perf_counter()
            for i in range(N):
                await ctx.call_tool(ref, **{**args, **({"title": f"t{i}"} if "title" in args else {})})
            return Done(result=(time.perf_counter() - t) / N)

    return Bench()


async def through_agentlife(tmp: Path, tool: str, args: dict[str, Any]) -> tuple[float, float]:
    """(seconds per call, seconds from run() to READY)."""
    ready: list[float] = []
    started = time.perf_counter()

    def on_event(runtime: Any, event: str, info: dict[str, Any]) -> None:
        if event == "ready":
            ready.append(time.perf_counter() - started)

    run = await AgentHarness(tmp / "data", time_scale=1.0).run(
        agent_for(tmp / "server", tool, args), on_event=on_event
    )
    assert run.exit_code == 0 and run.job is not None, run.log_messages()[-5:]
    return float(run.job.result), ready[0]


async def main() -> None:
    lookup = ("lookup", {"key": "k"})
    create = ("create_issue", {"title": "t"})
    bare_best = ours_best = float("inf")
    bare_starts, ready_times = [], []
    for _ in range(ROUNDS):
        with tempfile.TemporaryDirectory() as d:
            per, start = await bare_calls(Path(d) / "s", *lookup)
            bare_best, bare_starts = min(bare_best, per), [*bare_starts, start]
        with tempfile.TemporaryDirectory() as d:
            per, ready = await through_agentlife(Path(d), *lookup)
            ours_best, ready_times = min(ours_best, per), [*ready_times, ready]
    ratio = ours_best / bare_best
    emit(
        "read-only MCP call through ctx.call_tool",
        ours_best * 1e6,
        "us",
        "<= 1.2x the bare SDK call",
        baseline=round(bare_best * 1e6, 1),
        ratio=round(ratio, 3),
        **{"pass": ratio <= 1.2},
    )
    with tempfile.TemporaryDirectory() as d:
        per_create, _ = await through_agentlife(Path(d), *create)
    with tempfile.TemporaryDirectory() as d:
        bare_create, _ = await bare_calls(Path(d) / "s", *create)
    emit(
        "side-effecting MCP call (write-ahead, 2 fsyncs)",
        per_create * 1e6,
        "us",
        None,
        baseline=round(bare_create * 1e6, 1),
        ratio=round(per_create / bare_create, 3),
    )
    emit(
        "stdio MCP server start (spawn, initialize, tools/list), bare SDK", min(bare_starts) * 1e3, "ms", None
    )
    emit(
        "run() to READY with one stdio MCP server",
        min(ready_times) * 1e3,
        "ms",
        None,
        baseline=round(min(bare_starts) * 1e3, 1),
    )


if __name__ == "__main__":
    anyio.run(main)
