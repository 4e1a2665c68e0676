"""Fan-out: a parent job starts child jobs, waits for all of them, and sums their results.

Two agents in one module, each run by its own workers (one Deployment per agent):

    python -m agentlife db init
    python -m agentlife job create fanout --payload '{"children": 20}'
    python -m agentlife worker fanout_agent:FanOut &                       # the parents
    python -m agentlife worker fanout_agent:Square --concurrency 4 &       # the children

`FanOut` starts ``children`` jobs of `Square` (``ctx.start_job``: one journaled call each, so a resumed
parent starts none twice) and waits for them with ``ctx.wait_for_jobs``: the parent parks WAITING and frees
its worker; the end of its last child makes it runnable at once. Each `Square` appends one line to an
effects file (``FANOUT_EFFECTS``, by default ``{AGENTLIFE_DATA_DIR}/fanout-effects.log``; stands for an
external system, so with workers on several pods point it at a volume they share) through a journaled tool
with ``verify``, so the line is written exactly once whatever kills the worker, and ends with the square of
its number. The parent's result is
``{"sum": 0² + 1² + ... + (children-1)²}``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentlife import NOT_DONE, AgentProcess, Done, StepContext, tool

CHILD_AGENT = "fanout-square"


def effects_file() -> Path:
    """Where the children's effect lines go: one ``invocation_id n`` line per effect."""
    named = os.environ.get("FANOUT_EFFECTS")
    if named:
        return Path(named)
    return Path(os.environ.get("AGENTLIFE_DATA_DIR", ".agentlife")) / "fanout-effects.log"


async def _already_recorded(invocation_id: str) -> Any:
    """The effect's result when its line is in the file (a crash came after the write), else NOT_DONE."""
    path = effects_file()
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == invocation_id:
                return int(parts[1])
    return NOT_DONE


@tool(side_effects=True, verify=_already_recorded)
async def record_number(n: int, invocation_id: str) -> int:
    """Append ``invocation_id n`` to the effects file (the side effect), durably."""
    path = effects_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{invocation_id} {n}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return n


class Square(AgentProcess):
    """The child: records its number once and returns its square."""

    agent_id = CHILD_AGENT

    async def step(self, ctx: StepContext) -> Done | None:
        n = int(ctx.job.payload["n"])
        await ctx.call_tool(record_number, n=n)
        return Done({"square": n * n})


class FanOut(AgentProcess):
    """The parent: starts ``children`` Square jobs, waits for them all, and sums their squares."""

    agent_id = "fanout"

    async def step(self, ctx: StepContext) -> Done | None:
        count = int((ctx.job.payload or {}).get("children", 20))
        if count == 0:
            return Done({"sum": 0})  # nothing to start: wait_for_jobs([]) is refused
        handles = [await ctx.start_job(CHILD_AGENT, payload={"n": i}) for i in range(count)]
        outcomes = await ctx.wait_for_jobs(handles)
        failed = [o.job_id for o in outcomes if not o.ok]
        if failed:
            return Done({"failed": failed}, status="FAILED", reason=f"{len(failed)} children failed")
        return Done({"sum": sum(int(o.result["square"]) for o in outcomes)})
