"""Agents for the child-job tests with real processes, driven by environment.

Traces go to append-only files in ``FAMILY_DIR`` (``fsync``, so a SIGKILL cannot lose one):
``before`` / ``after`` (``invocation_id attempt``) each time the parent's tool before the starts or after
the wait really runs, ``child`` (``invocation_id n attempt``) each time a child's tool really runs. Marker
files: ``started-{attempt}`` once the parent has started its children, ``waking-{attempt}`` when the
parent's wait has returned, ``child-{n}-{attempt}`` when a child is inside its tool.

- `Parent` (``family``): ``before``, ``FAMILY_CHILDREN`` (default 3) children of `Child` numbered from 0,
  ``started-*``, ``FAMILY_PAUSE`` seconds, ``ctx.wait_for_jobs`` (timeout ``FAMILY_TIMEOUT`` when set),
  ``waking-*``, ``FAMILY_WAKE_PAUSE`` seconds, ``after``, then ``{"sum": ..., "statuses": [...]}``.
  ``FAMILY_DETACHED=n`` starts child ``n`` detached.
  ``FAMILY_BAD`` instead makes one bad call (see `BAD`) and records nothing else.
- `Child` (``family-child``): its tool (``CHILD_PAUSE`` seconds inside it) and ``{"square": n * n}``;
  ``CHILD_FAIL=n`` makes child ``n`` end FAILED.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import anyio

from agentlife import NOT_DONE, AgentProcess, Done, JobHandle, StepContext, tool


def _dir() -> Path:
    return Path(os.environ["FAMILY_DIR"])


def _append(name: str, line: str) -> None:
    fd = os.open(_dir() / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _attempt() -> str:
    return os.environ.get("AGENTLIFE_ATTEMPT", "1")


def _seen(name: str, invocation_id: str) -> bool:
    path = _dir() / name
    return path.exists() and any(line.split()[0] == invocation_id for line in path.read_text().splitlines())


async def _verify_child(invocation_id: str) -> Any:
    return "done" if _seen("child", invocation_id) else NOT_DONE


@tool(side_effects=True, verify=lambda i: _verify_named("before", i))
async def before(invocation_id: str) -> str:
    """The parent's effect before it starts its children."""
    _append("before", f"{invocation_id} {_attempt()}")
    return "before"


@tool(side_effects=True, verify=lambda i: _verify_named("after", i))
async def after(invocation_id: str) -> str:
    """The parent's effect after its wait."""
    _append("after", f"{invocation_id} {_attempt()}")
    return "after"


async def _verify_named(name: str, invocation_id: str) -> Any:
    return name if _seen(name, invocation_id) else NOT_DONE


@tool(side_effects=True, verify=_verify_child)
async def child_effect(n: int, invocation_id: str) -> str:
    """A child's effect, with a pause inside it (a kill lands there)."""
    _dir().joinpath(f"child-{n}-{_attempt()}").touch()
    await anyio.sleep(float(os.environ.get("CHILD_PAUSE", "0")))
    _append("child", f"{invocation_id} {n} {_attempt()}")
    return "done"


#: The bad calls ``FAMILY_BAD`` names.
BAD = {
    "empty-agent": lambda ctx: ctx.start_job("", payload={}),
    "hostile-agent": lambda ctx: ctx.start_job("../../etc/passwd", payload={}),
    "agent-not-str": lambda ctx: ctx.start_job(42, payload={}),
    "payload-set": lambda ctx: ctx.start_job("family-child", payload={1, 2}),
    "payload-nan": lambda ctx: ctx.start_job("family-child", payload={"x": math.nan}),
    "bad-job-id": lambda ctx: ctx.start_job("family-child", payload={}, job_id="a/b"),
    "own-id": lambda ctx: ctx.start_job("family-child", payload={}, job_id=ctx.job.id),
    "taken-id": lambda ctx: ctx.start_job("family-child", payload={}, job_id="stranger"),
    "wait-empty": lambda ctx: ctx.wait_for_jobs([]),
    "wait-not-handle": lambda ctx: ctx.wait_for_jobs(["stranger"]),
    "wait-one-handle": lambda ctx: ctx.wait_for_jobs(JobHandle("stranger", "family-child")),
    "wait-stranger": lambda ctx: ctx.wait_for_jobs([JobHandle("stranger", "family-child")]),
    "wait-unknown": lambda ctx: ctx.wait_for_jobs([JobHandle("nobody", "family-child")]),
    "timeout-nan": lambda ctx: ctx.wait_for_jobs([JobHandle("x", "y")], timeout=math.nan),
    "timeout-negative": lambda ctx: ctx.wait_for_jobs([JobHandle("x", "y")], timeout=-1),
}


class Parent(AgentProcess):
    """``before``, children, a wait for them all, ``after``."""

    agent_id = "family"

    async def step(self, ctx: StepContext) -> Done | None:
        bad = os.environ.get("FAMILY_BAD")
        if bad:
            await BAD[bad](ctx)
            return Done({"bad": "accepted"})
        await ctx.call_tool(before)
        count = int(os.environ.get("FAMILY_CHILDREN", "3"))
        detached = os.environ.get("FAMILY_DETACHED")  # this child's number is started detached
        handles = [
            await ctx.start_job("family-child", payload={"n": n}, detached=str(n) == detached)
            for n in range(count)
        ]
        _dir().joinpath(f"started-{_attempt()}").touch()
        await anyio.sleep(float(os.environ.get("FAMILY_PAUSE", "0")))
        raw = os.environ.get("FAMILY_TIMEOUT")
        outcomes = await ctx.wait_for_jobs(handles, timeout=None if raw is None else float(raw))
        _dir().joinpath(f"waking-{_attempt()}").touch()
        await anyio.sleep(float(os.environ.get("FAMILY_WAKE_PAUSE", "0")))
        await ctx.call_tool(after)
        squares = [o.result["square"] for o in outcomes if o.ok]
        return Done({"sum": sum(squares), "statuses": [o.status for o in outcomes]})


class Child(AgentProcess):
    """Its effect, then the square of its number."""

    agent_id = "family-child"

    async def step(self, ctx: StepContext) -> Done | None:
        n = int(ctx.job.payload["n"])
        await ctx.call_tool(child_effect, n=n)
        if os.environ.get("CHILD_FAIL") == str(n):
            return Done({"n": n}, status="FAILED", reason=f"child {n} was told to fail")
        return Done({"square": n * n})
