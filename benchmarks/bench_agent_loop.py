"""The agent loop's costs, each against a baseline measured in the same run.

* ``schema_cached``: reading a ``@tool``'s model-facing definition a second time (derived once through
  pydantic, then cached) against the first derivation; target <= 1 µs per read.
* ``run_tool_calls_overhead``: a step running N ``tool_use`` blocks through ``ctx.run_tool_calls``
  (argument validation against the type hints, result blocks) against the same step making the same N
  calls with bare ``ctx.call_tool``; target <= 1.2x per call.
* ``conversation_checkpoint_{sqlite,postgres}``: writing the checkpoint of a 200-turn conversation (4 KB
  per turn, appended as rows beside the checkpoint) at turn 200 against turn 1, time and bytes; target
  <= 2x. For scale, a checkpoint that carried the whole history in its state is reported beside it.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import emit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _pg import running_postgres
from agentlife import AgentProcess, Done, StepContext, tool
from agentlife._checkpoint import CheckpointDoc
from agentlife._journal._conversation import ConversationLog
from agentlife._llm._protocol import LLMReply
from agentlife.stores import PostgresStore, SQLiteStore
from agentlife.testing import AgentHarness

TURNS = 200
TURN_BYTES = 4096
CALLS = 200
ROUNDS = 7


# -- schema -------------------------------------------------------------------------------------------------


def bench_schema() -> None:
    first: list[float] = []
    for i in range(20):
        namespace: dict[str, Any] = {}
        exec(  # a new function each time: nothing cached
            f"async def lookup_{i}(query: str, limit: int = 3, tags: list[str] | None = None) -> str:\n"
            "    '''Search.\n\n    Args:\n        query: words.\n        limit: hits.\n    '''\n"
            "    return query\n",
            namespace,
        )
        spec = tool(side_effects=False)(namespace[f"lookup_{i}"])
        started = time.perf_counter()
        _ = spec.definition
        first.append(time.perf_counter() - started)
    reads = 200_000
    started = time.perf_counter()
    for _ in range(reads):
        _ = spec.definition
    cached = (time.perf_counter() - started) / reads
    emit(
        "agent_loop",
        "schema_cached: second read of a tool's definition",
        cached * 1e6,
        "µs",
        baseline=statistics.median(first) * 1e6,
        target="<= 1 µs per cached read",
        ok=cached * 1e6 <= 1.0,
    )


# -- run_tool_calls -----------------------------------------------------------------------------------------


@tool(side_effects=False)
async def echo(text: str, times: int = 1) -> str:
    """Echo the text."""
    return text * times


REPLY = LLMReply(
    text="",
    content=tuple(
        {"type": "tool_use", "id": f"toolu_{i}", "name": "echo", "input": {"text": "x", "times": 2}}
        for i in range(CALLS)
    ),
    stop_reason="tool_use",
)


class ToolCaller(AgentProcess):
    agent_id = "bench-tools"

    def __init__(self, mode: str, timings: list[float]) -> None:
        self.mode = mode
        self.timings = timings

    async def step(self, ctx: StepContext) -> Done | None:
        started = time.perf_counter()
        if self.mode == "bare":
            for _ in range(CALLS):
                await ctx.call_tool(echo, text="x", times=2)
        else:
            await ctx.run_tool_calls(REPLY, tools=[echo])
        self.timings.append((time.perf_counter() - started) / CALLS)
        return Done(result=None)


async def bench_run_tool_calls() -> None:
    bare: list[float] = []
    loop: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        harness = AgentHarness(Path(tmp))
        for i in range(ROUNDS):  # interleaved, so drift affects both alike
            await harness.run(ToolCaller("bare", bare), job_id=f"bare-{i}")
            await harness.run(ToolCaller("loop", loop), job_id=f"loop-{i}")
    value, baseline = statistics.median(loop[1:]), statistics.median(bare[1:])
    emit(
        "agent_loop",
        "run_tool_calls_overhead: per tool call, against a bare ctx.call_tool",
        value * 1e6,
        "µs",
        baseline=baseline * 1e6,
        target="<= 1.2x",
        ok=value <= 1.2 * baseline,
    )


# -- conversation checkpoints -----------------------------------------------------------------------------


def turn(step: int) -> list[dict[str, Any]]:
    body = f"turn {step} " + "y" * (TURN_BYTES // 2 - 16)
    return [{"role": "user", "content": body}, {"role": "assistant", "content": body[::-1]}]


async def conversation_writes(store: Any, job_id: str) -> tuple[list[float], list[int], int]:
    await store.init_schema()
    await store.create_job(job_id, "bench", None)
    await store.claim(job_id, 1)
    log = ConversationLog()
    times: list[float] = []
    sizes: list[int] = []
    for step in range(TURNS):
        view = log.begin_step()
        view.extend(turn(step))
        doc = CheckpointDoc(next_step=step + 1, state={"turn": step}, conversation=view.meta())
        data = doc.encode()
        started = time.perf_counter()
        await store.write_checkpoint(job_id, 1, f"c{step}", step, data, view.new_rows())
        times.append(time.perf_counter() - started)
        sizes.append(len(data))
        view.commit()
    whole = CheckpointDoc(next_step=TURNS, state={"messages": [m for s in range(TURNS) for m in turn(s)]})
    return times, sizes, len(whole.encode())


async def bench_conversation(kind: str, store: Any) -> None:
    await store.open()
    try:
        times, sizes, whole = await conversation_writes(store, "conversation")
    finally:
        await store.close()
    early, late = statistics.median(times[:20]), statistics.median(times[-20:])
    emit(
        "agent_loop",
        f"conversation_checkpoint_{kind}: write time at turn {TURNS} (4 KB/turn) against turn 1",
        late * 1000,
        "ms",
        baseline=early * 1000,
        target="<= 2x",
        ok=late <= 2 * early,
    )
    emit(
        "agent_loop",
        f"conversation_checkpoint_{kind}_bytes: checkpoint size at turn {TURNS} against turn 1",
        sizes[-1],
        "bytes",
        baseline=sizes[0],
        target="<= 2x",
        ok=sizes[-1] <= 2 * sizes[0],
        whole_history_in_state_bytes=whole,
    )


async def main() -> None:
    bench_schema()
    await bench_run_tool_calls()
    with tempfile.TemporaryDirectory() as tmp:
        await bench_conversation("sqlite", SQLiteStore(Path(tmp) / "bench.db"))
    with running_postgres() as server:
        await bench_conversation("postgres", PostgresStore(server.create_schema()))


if __name__ == "__main__":
    asyncio.run(main())
