"""An agent that sleeps durably between two side effects, for the wait tests with real processes.

Every trace goes to append-only files in ``WAIT_DIR``, written with ``fsync`` so a SIGKILL cannot lose one:
``before`` and ``after`` (``invocation_id attempt``) each time the side-effecting tool before or after the
sleep really runs; the file ``sleeping-{attempt}`` is touched just before the sleep is called.

- `Listener`: step 0 calls ``before``, waits twice for the event ``answer`` (``ctx.wait_for_event``, with
  ``EVENT_TIMEOUT`` seconds when set), calls ``after`` and ends with ``{"got": [payload, payload]}``.
- `Sleeper`: step 0 calls ``before``, sleeps ``WAIT_SECONDS`` (``ctx.sleep``; with ``WAIT_UNTIL`` set, a unix
  time, ``ctx.sleep_until`` that time), calls ``after`` and ends with ``{"slept": true}``.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from agentlife import NOT_DONE, AgentProcess, Done, StepContext, tool


def _dir() -> Path:
    return Path(os.environ["WAIT_DIR"])


def _append(name: str, line: str) -> None:
    fd = os.open(_dir() / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _attempt() -> str:
    return os.environ.get("AGENTLIFE_ATTEMPT", "1")


def _verify(name: str) -> Any:
    """``verify`` for an effect: its line names the invocation id. Without one, a kill between the
    effect and its journaled completion runs it again (at least once), as documented."""

    async def verify(invocation_id: str) -> Any:
        path = _dir() / name
        lines = path.read_text().splitlines() if path.exists() else []
        return name if any(line.split()[0] == invocation_id for line in lines) else NOT_DONE

    return verify


@tool(side_effects=True, verify=_verify("before"))
async def before(invocation_id: str) -> str:
    """The effect before the sleep."""
    _append("before", f"{invocation_id} {_attempt()}")
    return "before"


@tool(side_effects=True, verify=_verify("after"))
async def after(invocation_id: str) -> str:
    """The effect after the sleep."""
    _append("after", f"{invocation_id} {_attempt()}")
    return "after"


class Sleeper(AgentProcess):
    """``before``, a durable sleep, ``after``."""

    agent_id = "sleeper"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(before)
        _dir().joinpath(f"sleeping-{_attempt()}").touch()
        until = os.environ.get("WAIT_UNTIL")
        if until is not None:
            await ctx.sleep_until(dt.datetime.fromtimestamp(float(until), dt.UTC))
        else:
            await ctx.sleep(float(os.environ.get("WAIT_SECONDS", "0")))
        await ctx.call_tool(after)
        return Done({"slept": True})


class Listener(AgentProcess):
    """``before``, two waits for the event ``answer``, ``after``."""

    agent_id = "listener"

    async def step(self, ctx: StepContext) -> Done | None:
        await ctx.call_tool(before)
        _dir().joinpath(f"sleeping-{_attempt()}").touch()
        raw = os.environ.get("EVENT_TIMEOUT")
        timeout = None if raw is None else float(raw)
        got = [await ctx.wait_for_event("answer", timeout=timeout) for _ in range(2)]
        await ctx.call_tool(after)
        return Done({"got": got})
