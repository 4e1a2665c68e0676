"""What agentlife adds to an MCP tool call, and what one stdio MCP server adds to start-up.

Per call (the target, <= 1.2x): one step calls a read-only MCP tool N times through ``ctx.call_tool``
(arguments checked against the tool's JSON Schema, journaled, replay-checked, timed out, in a span, counted)
against a bare ``ClientSession.call_tool`` loop on the same kind of server. The two alternate ROUNDS times;
each side's best round is the figure, and the spread of the per-round ratios is reported beside it.

Where the difference goes: inside one agent step, on one server, alternating batches of
- the bare SDK call on the job's own live session (the same process, loop and background tasks),
- a native ``@tool`` whose body is that bare call (what every journaled tool call costs), and
- the MCP tool through ``ctx.call_tool`` (what MCP support adds on top: schema check, result conversion).
Each with its wall time and the CPU time of the loop's thread per call (steadier on a shared machine).

The write-ahead path of a side-effecting tool (two fsyncs per call) is reported without a target: its cost
is the disk's. Start-up: ``Runtime.run()`` to READY with one stdio server, next to the server's own start
(spawn, ``initialize``, ``tools/list`` through the bare SDK) measured apart.

Run: python benchmarks/bench_mcp.py  (one JSON object per line)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
from _common import emit

from agentlife import AgentProcess, Done, MCPServer, StepContext, tool
from agentlife._mcp._server import CURRENT_MCP
from agentlife.testing import AgentHarness

# Served by the SDK's own server (``--sdk``): the baseline is a realistic server, not the tests' plain one.
SERVER = str(Path(__file__).resolve().parent.parent / "tests" / "mcp_test_server.py")
N = 200
ROUNDS = 5
WARMUP = 20
BATCH, BATCHES = 40, 10


async def bare_calls(state: Path, tool_name: str, args: dict[str, Any]) -> tuple[float, float]:
    """(seconds per call, seconds to start) through the SDK alone."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=[SERVER, str(state), "--sdk"])
    started = time.perf_counter()
    async with stdio_client(params) as (r, w), ClientSession(r, w) as session:
        await session.initialize()
        await session.list_tools()
        start = time.perf_counter() - started
        for _ in range(WARMUP):
            await session.call_tool(tool_name, args)
        t = time.perf_counter()
        for i in range(N):
            await session.call_tool(tool_name, {**args, **({"title": f"t{i}"} if "title" in args else {})})
        return (time.perf_counter() - t) / N, start


def agent_for(state: Path, tool_name: str, args: dict[str, Any]) -> AgentProcess:
    server = MCPServer.stdio(sys.executable, [SERVER, str(state), "--sdk"])

    class Bench(AgentProcess):
        agent_id = "bench-mcp"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            ref = server.tool(tool_name)
            for _ in range(WARMUP):
                await ctx.call_tool(ref, **args)
            t = time.perf_counter()
            for i in range(N):
                await ctx.call_tool(ref, **{**args, **({"title": f"t{i}"} if "title" in args else {})})
            return Done(result=(time.perf_counter() - t) / N)

    return Bench()


async def through_agentlife(tmp: Path, tool_name: str, args: dict[str, Any]) -> tuple[float, float]:
    """(seconds per call, seconds from run() to READY)."""
    ready: list[float] = []
    started = time.perf_counter()

    def on_event(runtime: Any, event: str, info: dict[str, Any]) -> None:
        if event == "ready":
            ready.append(time.perf_counter() - started)

    run = await AgentHarness(tmp / "data", time_scale=1.0).run(
        agent_for(tmp / "server", tool_name, args), on_event=on_event
    )
    assert run.exit_code == 0 and run.job is not None, run.log_messages()[-5:]
    return float(run.job.result), ready[0]


def decomposing_agent(state: Path) -> AgentProcess:
    """One step that times the bare call, a native tool around it and the MCP tool, in alternating batches."""
    server = MCPServer.stdio(sys.executable, [SERVER, str(state), "--sdk"])

    class Decompose(AgentProcess):
        agent_id = "bench-mcp-parts"
        mcp_servers: ClassVar[Any] = (server,)

        async def step(self, ctx: StepContext) -> Done | None:
            session = CURRENT_MCP.get()._connections[server.key]._session

            @tool(side_effects=False)
            async def native_lookup(key: str) -> Any:
                """The same SDK call as an ordinary tool."""
                return (await session.call_tool("lookup", {"key": key})).content[0].text

            ref = server.tool("lookup")
            variants: dict[str, Callable[[], Awaitable[Any]]] = {
                "bare": lambda: session.call_tool("lookup", {"key": "k"}),
                "native": lambda: ctx.call_tool(native_lookup, key="k"),
                "mcp": lambda: ctx.call_tool(ref, key="k"),
            }
            timings: dict[str, list[list[float]]] = {name: [] for name in variants}
            for call in variants.values():
                for _ in range(WARMUP):
                    await call()
            for _ in range(BATCHES):
                for name, call in variants.items():
                    wall, cpu = time.perf_counter(), time.thread_time()
                    for _ in range(BATCH):
                        await call()
                    timings[name].append(
                        [(time.perf_counter() - wall) / BATCH, (time.thread_time() - cpu) / BATCH]
                    )
            return Done(result=timings)

    return Decompose()


def spread(ratios: list[float]) -> dict[str, float]:
    return {
        "min": round(min(ratios), 3),
        "median": round(statistics.median(ratios), 3),
        "max": round(max(ratios), 3),
    }


async def per_call_target() -> list[float]:
    """The target: ctx.call_tool against the bare SDK call, alternating rounds; returns the start times."""
    bare: list[float] = []
    ours: list[float] = []
    bare_starts: list[float] = []
    ready_times: list[float] = []
    for _ in range(ROUNDS):
        with tempfile.TemporaryDirectory() as d:
            per, start = await bare_calls(Path(d) / "s", "lookup", {"key": "k"})
            bare, bare_starts = [*bare, per], [*bare_starts, start]
        with tempfile.TemporaryDirectory() as d:
            per, ready = await through_agentlife(Path(d), "lookup", {"key": "k"})
            ours, ready_times = [*ours, per], [*ready_times, ready]
    ratio = min(ours) / min(bare)
    emit(
        "mcp",
        "read-only MCP call through ctx.call_tool",
        min(ours) * 1e6,
        "us",
        baseline=min(bare) * 1e6,
        target="<= 1.2x the bare SDK call",
        ok=ratio <= 1.2,
        round_ratios=spread([o / b for o, b in zip(ours, bare, strict=True)]),
    )
    emit(
        "mcp",
        "stdio MCP server start (spawn, initialize, tools/list), bare SDK",
        min(bare_starts) * 1e3,
        "ms",
    )
    emit(
        "mcp",
        "run() to READY with one stdio MCP server",
        min(ready_times) * 1e3,
        "ms",
        baseline=min(bare_starts) * 1e3,
    )
    return ready_times


async def where_it_goes() -> None:
    """The difference split: the ordinary tool path, then what MCP support adds on top of it."""
    with tempfile.TemporaryDirectory() as d:
        run = await AgentHarness(Path(d) / "data", time_scale=1.0).run(decomposing_agent(Path(d) / "s"))
    assert run.exit_code == 0 and run.job is not None, run.log_messages()[-5:]
    timings: dict[str, list[list[float]]] = run.job.result
    wall = {name: min(t[0] for t in rows) for name, rows in timings.items()}
    cpu = {name: statistics.median(t[1] for t in rows) for name, rows in timings.items()}
    us = {name: round(v * 1e6, 1) for name, v in cpu.items()}
    emit(
        "mcp",
        "native @tool around the bare SDK call (the journaled tool path), same process",
        wall["native"] * 1e6,
        "us",
        baseline=wall["bare"] * 1e6,
        cpu_us={"bare": us["bare"], "native": us["native"]},
    )
    emit(
        "mcp",
        "MCP tool through ctx.call_tool vs that native @tool (what MCP support adds)",
        wall["mcp"] * 1e6,
        "us",
        baseline=wall["native"] * 1e6,
        cpu_us={"native": us["native"], "mcp": us["mcp"]},
    )


async def main() -> None:
    await per_call_target()
    await where_it_goes()
    with tempfile.TemporaryDirectory() as d:
        per_create, _ = await through_agentlife(Path(d), "create_issue", {"title": "t"})
    with tempfile.TemporaryDirectory() as d:
        bare_create, _ = await bare_calls(Path(d) / "s", "create_issue", {"title": "t"})
    emit(
        "mcp",
        "side-effecting MCP call (write-ahead, 2 fsyncs)",
        per_create * 1e6,
        "us",
        baseline=bare_create * 1e6,
    )


if __name__ == "__main__":
    anyio.run(main)
